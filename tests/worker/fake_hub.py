"""A local Hugging Face Hub endpoint (HF_ENDPOINT) serving model directories as the Hub does, for
`huggingface_hub` as the client: `GET /api/models/{repo}[/revision/{rev}]` (model-info, with files
metadata: LFS sha256 for *.safetensors, the git blob sha1 for the rest) and `HEAD|GET
/{repo}/resolve/{rev}/{path}` (X-Repo-Commit, ETag, Range). A gated repo answers 401 GatedRepo to a
download without its token, as the Hub does; a private repo answers every route 401 RepoNotFound
without its token (the Hub's answer for a private repo and a missing one alike, to an anonymous
caller); a repo or revision it lacks, 404 with the Hub's X-Error-Code. Every request is logged
(method, path, Range); `cut_after` ends the first GET of a file after so many bytes, `corrupt` flips
a byte of every GET of a file.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".pt")


@dataclass
class Commit:
    sha: str
    files: dict[str, Path]  # repo path -> local file


@dataclass
class FakeRepo:
    commits: list[Commit]  # newest last
    branches: dict[str, str]  # name -> sha
    gated_token: str = ""  # set: a gated repo, readable with this token
    private_token: str = ""  # set: a private repo, seen only with this token

    def commit(self, revision: str) -> Commit | None:
        sha = self.branches.get(revision, revision)
        return next((c for c in self.commits if c.sha == sha), None)


def files_of(directory: Path) -> dict[str, Path]:
    return {str(p.relative_to(directory)): p for p in sorted(directory.rglob("*")) if p.is_file()}


def _metadata(path: str, local: Path) -> dict[str, object]:
    data = local.read_bytes()
    if path.endswith(LFS_SUFFIXES):
        sha256 = hashlib.sha256(data).hexdigest()
        blob = hashlib.sha1(f"version https://git-lfs...{sha256}".encode()).hexdigest()  # a pointer's id
        return {
            "rfilename": path,
            "size": len(data),
            "blobId": blob,
            "lfs": {"size": len(data), "sha256": sha256, "pointerSize": 134},
        }
    blob = hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()
    return {"rfilename": path, "size": len(data), "blobId": blob}


@dataclass
class FakeHub:
    repos: dict[str, FakeRepo]
    requests: list[tuple[str, str, str]] = field(default_factory=list)  # (method, path, Range)
    cut_after: dict[str, int] = field(default_factory=dict)  # repo path -> bytes, first GET only
    corrupt: set[str] = field(default_factory=set)  # repo paths
    _metadata: dict[tuple[str, str], dict[str, object]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def metadata(self, path: str, local: Path) -> dict[str, object]:
        key = (path, str(local))
        if key not in self._metadata:
            self._metadata[key] = _metadata(path, local)
        return self._metadata[key]

    def serve(self) -> tuple[ThreadingHTTPServer, str]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_: object) -> None:
                pass

            def do_HEAD(self) -> None:
                self._answer(is_head=True)

            def do_GET(self) -> None:
                self._answer(is_head=False)

            def _error(self, status: int, code: str, message: str) -> None:
                body = json.dumps({"error": message}).encode()
                self.send_response(status)
                self.send_header("X-Error-Code", code)
                self.send_header("X-Error-Message", message)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _answer(self, is_head: bool) -> None:
                path = unquote(urlsplit(self.path).path)
                with hub._lock:
                    hub.requests.append((self.command, path, self.headers.get("Range", "")))
                if path.startswith("/api/models/"):
                    return self._model_info(path.removeprefix("/api/models/"))
                repo_id, sep, rest = path.lstrip("/").partition("/resolve/")
                if not sep:
                    return self._error(404, "RepoNotFound", "not a route of this Hub")
                revision, _, file = rest.partition("/")
                return self._resolve(repo_id, unquote(revision), file, is_head)

            def _repo(self, repo_id: str) -> FakeRepo | None:
                repo = hub.repos.get(repo_id)
                if repo is None:
                    self._error(404, "RepoNotFound", f"Repository Not Found for {repo_id}")
                elif repo.private_token and (
                    self.headers.get("Authorization") != f"Bearer {repo.private_token}"
                ):
                    self._error(401, "RepoNotFound", f"Repository Not Found for {repo_id}")
                    return None
                return repo

            def _model_info(self, rest: str) -> None:
                repo_id, _, revision = rest.partition("/revision/")
                repo = self._repo(repo_id)
                if repo is None:
                    return
                commit = repo.commit(revision or "main")
                if commit is None:
                    return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
                info = {
                    "id": repo_id,
                    "modelId": repo_id,
                    "sha": commit.sha,
                    "private": False,
                    "gated": "manual" if repo.gated_token else False,
                    "siblings": [hub.metadata(p, local) for p, local in commit.files.items()],
                }
                body = json.dumps(info).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _resolve(self, repo_id: str, revision: str, file: str, is_head: bool) -> None:
                repo = self._repo(repo_id)
                if repo is None:
                    return
                if repo.gated_token and self.headers.get("Authorization") != f"Bearer {repo.gated_token}":
                    return self._error(
                        401,
                        "GatedRepo",
                        f"Access to model {repo_id} is restricted. You must have access to it "
                        "and be authenticated to access it. Please log in.",
                    )
                commit = repo.commit(revision)
                if commit is None:
                    return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
                local = commit.files.get(file)
                if local is None:
                    return self._error(404, "EntryNotFound", f"{file} does not exist at {commit.sha}")
                meta = hub.metadata(file, local)
                size = local.stat().st_size
                start = 0
                ranged = self.headers.get("Range", "")
                if ranged.startswith("bytes="):
                    start = int(ranged.removeprefix("bytes=").split("-")[0])
                etag = meta["lfs"]["sha256"] if "lfs" in meta else meta["blobId"]  # type: ignore[index]
                self.send_response(206 if start else 200)
                self.send_header("X-Repo-Commit", commit.sha)
                self.send_header("ETag", f'"{etag}"')
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(size - start))
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
                self.end_headers()
                if is_head:
                    return
                data = bytearray(local.read_bytes()[start:])
                if file in hub.corrupt and data:
                    data[len(data) // 2] ^= 0xFF
                with hub._lock:
                    cut = hub.cut_after.pop(file, None)
                if cut is not None:
                    self.wfile.write(data[:cut])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                self.wfile.write(data)

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name="fake-hub", daemon=True).start()
        return server, f"http://127.0.0.1:{server.server_port}"
