"""`make run`, the README's first command, fails fast and says why when it cannot serve: a taken port
makes it exit non-zero within seconds, naming the ports and the variables that move them. Serving,
its workers' ports ask for a token made for the run while the gateway answers the README's curl as
it is. Stopped with Ctrl-C it stops its processes, removes the token and says so in one clean line."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import threading
import time
from pathlib import Path

import grpc
import httpx
import pytest
from local_ports import free_port

from kembed.proto import embedder_pb2 as pb
from kembed.proto.embedder_pb2_grpc import EmbedderStub

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def test_make_run_with_a_taken_port_exits_non_zero_in_seconds():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()  # something else serves here (and never answers)
        port = taken.getsockname()[1]
        env = os.environ | {
            "PORT": str(port),
            "WORKER_PORT": str(free_port()),
            "WORKER_DATA_PORT": str(free_port()),
            "WORKER_METRICS_PORT": str(free_port()),
        }
        started = time.monotonic()
        # its own session: on failure `make run` stops its whole process group, as Ctrl-C would
        done = subprocess.run(
            ["make", "--no-print-directory", "run"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            start_new_session=True,
            check=False,
        )
        elapsed = time.monotonic() - started
    assert done.returncode != 0
    assert elapsed < 10, elapsed
    assert "kembed did not start" in done.stdout and f"PORT={port} (gateway)" in done.stdout
    assert f"WORKER_DATA_PORT={env['WORKER_DATA_PORT']} (worker data)" in done.stdout


def as_a_terminal_job() -> None:
    """SIGINT as a shell started from a terminal has it: a test run started in the background (`make
    test &`, a CI runner) inherits it ignored, and a shell cannot trap a signal ignored at its start."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def token_files_of(session: int) -> set[Path]:
    """The `--auth-token-file` and `--worker-auth-token-file` paths of the processes of a session."""
    paths = set()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if os.getsid(int(proc.name)) != session:
                continue
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # gone meanwhile
        paths |= {
            Path(os.fsdecode(args[i + 1])) for i, arg in enumerate(args[:-1]) if arg.endswith(b"token-file")
        }
    return paths


def check_the_token(ports: dict[str, int], session: int) -> Path:
    """The workers ask for the run's token (one file, mode 600, all processes given it), the gateway
    answers as the README shows; the token file's path."""
    (token_file,) = token_files_of(session)
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    with grpc.insecure_channel(f"127.0.0.1:{ports['WORKER_PORT']}") as channel:
        with pytest.raises(grpc.RpcError) as refused:
            EmbedderStub(channel).Info(pb.InfoRequest(), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        token = token_file.read_text().strip()
        info = EmbedderStub(channel).Info(
            pb.InfoRequest(), timeout=10, metadata=(("authorization", f"Bearer {token}"),)
        )
    assert info.frame_port == ports["WORKER_DATA_PORT"]
    response = httpx.post(
        f"http://127.0.0.1:{ports['PORT']}/v1/embeddings",
        headers={"Content-Type": "application/json"},
        content='{"input": ["hello world", "kembed"], "encoding_format": "float"}',
        timeout=30,
    )
    assert response.status_code == 200 and len(response.json()["data"]) == 2, response.text
    return token_file


@pytest.mark.parametrize(
    ("signal_", "to_group"),
    [(signal.SIGINT, True), (signal.SIGTERM, False)],
    ids=["ctrl-c-to-the-process-group", "sigterm-to-make"],
)
def test_a_stopped_make_run_says_so_in_one_clean_line(signal_, to_group):
    """Ctrl-C reaches the whole foreground process group: make, its recipe, the worker and the gateway;
    SIGTERM to make (`kill`, `timeout`) reaches make, which passes it to its recipe. Either way the
    recipe stops its processes and ends on "kembed stopped", and make ends by the signal it got (GNU
    make re-raises it once its recipe is done; shells print nothing for a SIGINT), never with make's
    "Terminated" or an "Error" line."""
    names = ("PORT", "WORKER_PORT", "WORKER_DATA_PORT", "WORKER_METRICS_PORT")
    ports = {name: free_port() for name in names}
    env = os.environ | {name: str(port) for name, port in ports.items()}
    run = subprocess.Popen(
        ["make", "--no-print-directory", "run"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
        preexec_fn=as_a_terminal_job,
    )
    assert run.stdout is not None
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        for line in run.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("kembed is serving"):
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert ready.wait(120), "\n".join(lines[-40:])
        token_file = check_the_token(ports, run.pid)
        (os.killpg if to_group else os.kill)(run.pid, signal_)
        run.wait(timeout=30)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
        reader.join(timeout=10)
        run.stdout.close()
    output = "\n".join(lines)
    assert run.returncode == -signal_, output[-3000:]
    assert [line for line in lines if line.strip()][-1] == "kembed stopped", output[-3000:]
    assert "Terminated" not in output and "Error" not in output, output[-3000:]
    assert not token_file.exists()
    for name, port in ports.items():  # every process it started is gone: its port is free again
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError as error:
                pytest.fail(f"{name}={port} is still taken after make run stopped: {error}")


def test_make_run_serves_the_model_directory_it_is_given_on_both_sides(tmp_path):
    """`make run MODEL=dir`: the workers load `dir` and the gateway tokenizes for it (docs/your-model.md)."""
    import shutil

    from kembed.worker.config import bundled_model_dir

    model = tmp_path / "my-model"
    shutil.copytree(bundled_model_dir(), model)
    names = ("PORT", "WORKER_PORT", "WORKER_DATA_PORT", "WORKER_METRICS_PORT")
    ports = {name: free_port() for name in names}
    env = os.environ | {name: str(port) for name, port in ports.items()}
    run = subprocess.Popen(
        ["make", "--no-print-directory", "run", f"MODEL={model}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert run.stdout is not None
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        for line in run.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("kembed is serving"):
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert ready.wait(120), "\n".join(lines[-40:])
        info = httpx.get(f"http://127.0.0.1:{ports['PORT']}/info", timeout=10).json()
        (worker,) = info["workers"]
        assert info["model_id"] == "my-model" and worker["serving"], info
        assert (
            worker["tokenizer_digest"] == info["tokenizer_digest"]
            and worker["model_digest"] == info["model_digest"]
        )
        response = httpx.post(
            f"http://127.0.0.1:{ports['PORT']}/v1/embeddings", json={"input": "hi"}, timeout=30
        )
        assert response.status_code == 200, response.text
    finally:
        os.killpg(run.pid, signal.SIGTERM)
        run.wait(timeout=30)
        reader.join(timeout=10)
        run.stdout.close()


def test_make_run_with_only_the_worker_on_another_model_exits_saying_why(tmp_path):
    """`KEMBED_WORKER_MODEL=dir make run` (the variable `kembed-worker --help` names) moved the worker
    alone, and the gateway, tokenizing for the bundled model, answered wrong vectors. Now it refuses
    that worker and make run stops at once, saying what to type instead."""
    import json
    import shutil

    from kembed.worker.config import bundled_model_dir

    cased = tmp_path / "cased"
    shutil.copytree(bundled_model_dir(), cased)
    tokenizer = json.loads((cased / "tokenizer.json").read_text())
    tokenizer["normalizer"]["lowercase"] = False
    (cased / "tokenizer.json").write_text(json.dumps(tokenizer))
    names = ("PORT", "WORKER_PORT", "WORKER_DATA_PORT", "WORKER_METRICS_PORT")
    env = os.environ | {name: str(free_port()) for name in names} | {"KEMBED_WORKER_MODEL": str(cased)}
    done = subprocess.run(
        ["make", "--no-print-directory", "run"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,
        check=False,
    )
    assert done.returncode != 0, done.stdout[-3000:]
    assert "the gateway refused 1 worker(s) serving another model" in done.stdout, done.stdout[-3000:]
    assert "make run MODEL=dir" in done.stdout
    assert "refused: serves another model: its tokenizer" in done.stdout + done.stderr


def test_make_run_serves_every_listed_model_behind_one_gateway(tmp_path):
    """`make run MODELS="first=dirA dirB"`: a worker each, one gateway routing by the model named,
    dirB under its directory's name (docs/your-model.md)."""
    import shutil

    from kembed.worker.config import bundled_model_dir

    model = tmp_path / "my-model"
    shutil.copytree(bundled_model_dir(), model)
    names = ("PORT", "WORKER_PORT", "WORKER_DATA_PORT", "WORKER_METRICS_PORT")
    ports = {name: free_port() for name in names}
    env = os.environ | {name: str(port) for name, port in ports.items()}
    run = subprocess.Popen(
        ["make", "--no-print-directory", "run", f"MODELS=first={bundled_model_dir()} {model}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert run.stdout is not None
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        for line in run.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("kembed is serving"):
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    url = f"http://127.0.0.1:{ports['PORT']}"
    try:
        assert ready.wait(180), "\n".join(lines[-40:])
        listed = httpx.get(f"{url}/v1/models", timeout=10).json()["data"]
        assert [(m["id"], m["state"]) for m in listed] == [("first", "serving"), ("my-model", "serving")]
        for name in ("first", "my-model"):
            info = httpx.get(f"{url}/info", headers={"X-Kembed-Model": name}, timeout=10).json()
            (worker,) = info["workers"]
            assert info["served_model_name"] == name and worker["serving"], info
            response = httpx.post(f"{url}/v1/embeddings", json={"input": "hi", "model": name}, timeout=30)
            assert response.status_code == 200 and response.json()["model"] == name, response.text
    finally:
        os.killpg(run.pid, signal.SIGTERM)
        run.wait(timeout=30)
        reader.join(timeout=10)
        run.stdout.close()
