"""Starting real kembed processes for end-to-end tests: free ports, logs, readiness, teardown."""

import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from local_ports import free_port  # processes.free_port, as the tests import it

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
PROMPTS = {"query": "query: ", "passage": "passage: "}
# The cross-encoder's position limit (conftest.py's cross_encoder_dir): both sides of a pair are cut to
# fit it. Here, not in conftest.py, for the tests to import: `conftest` names another folder's too.
CROSS_ENCODER_MAX_LENGTH = 128


@dataclass
class Process:
    name: str
    popen: subprocess.Popen
    log: Path

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)


def spawn(name: str, args: list[str], log_dir: Path) -> Process:
    log = log_dir / f"{name}.log"
    with log.open("w") as out:  # the child keeps its own descriptor
        popen = subprocess.Popen(
            [sys.executable, "-P", "-m", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    return Process(name, popen, log)


def wait_ready(url: str, processes: list[Process], timeout_s: float = 90, path: str = "/ready") -> None:
    """Until `url` answers `path` 200 (`/health`: up, with or without a worker); fails naming a
    process that exited, or with every log after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for proc in processes:
            if proc.popen.poll() is not None:
                pytest.fail(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.log.read_text()}")
        try:
            if httpx.get(f"{url}{path}", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    logs = "\n".join(f"--- {p.name}\n{p.log.read_text()}" for p in processes)
    pytest.fail(f"{url}{path} not 200 after {timeout_s}s\n{logs}")


def wait_all_serving(url: str, timeout_s: float = 60) -> None:
    """Until the gateway sees every worker replica serving (/ready needs only one)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        workers = httpx.get(f"{url}/info", timeout=5).json()["workers"]
        if all(w["serving"] for w in workers):
            return
        time.sleep(0.2)
    pytest.fail(f"not every worker behind {url} became serving: {workers}")


@dataclass
class Stack:
    url: str
    workers: list[str]
    processes: list[Process]
    worker_metrics_ports: list[int] = field(default_factory=list)  # of the workers started here


def start_stack(
    log_dir: Path,
    num_workers: int,
    model_dir: Path | None = None,
    worker_addresses: list[str] | None = None,
    gateway_args: tuple[str, ...] = (),
    worker_model_dir: Path | None = None,
    worker_flags: tuple[str, ...] = (),
) -> Stack:
    """`num_workers` new CPU workers (on `worker_model_dir`, else the bundled model; `worker_flags`
    added) plus any running `worker_addresses`, behind a new gateway whose tokenizer comes from
    `model_dir` (else bundled)."""
    processes: list[Process] = []
    addresses = list(worker_addresses or [])
    worker_args = ["--model", str(worker_model_dir)] if worker_model_dir is not None else []
    metrics_ports = []
    for i in range(num_workers):
        port = free_port()
        metrics_ports.append(free_port())
        processes.append(
            spawn(
                f"worker{i}-{port}",
                # A metrics port of its own: several workers run on this host.
                [
                    "kembed.worker",
                    "--port",
                    str(port),
                    "--metrics-port",
                    str(metrics_ports[-1]),
                    "--device",
                    "cpu",
                    *worker_args,
                    *worker_flags,
                ],
                log_dir,
            )
        )
        addresses.append(f"127.0.0.1:{port}")
    port = free_port()
    args = ["kembed.gateway", "--port", str(port), *gateway_args]
    if model_dir is not None:
        args += ["--model", str(model_dir)]
    for address in addresses:
        args += ["--worker", address]
    processes.append(spawn(f"gateway-{port}", args, log_dir))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, processes)
        wait_all_serving(url)
    except BaseException:
        for proc in processes:
            proc.stop()
        raise
    return Stack(url, addresses, processes, metrics_ports)
