"""What fetch-model asks of a model source (the Hub: fetch_hub.py, S3: fetch_s3.py), and what a
source answers: its files with their checksums, resolved to one commit or digest; `FetchError`,
one word of reason per failure."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

CHUNK_BYTES = 1 << 20  # a download's read size


class FetchError(Exception):
    """A fetch that failed; `reason` is one word (the metric's label), `object` the file or key."""

    def __init__(self, reason: str, message: str, object_: str = "", *, is_transient: bool = False) -> None:
        super().__init__(message)
        self.reason, self.object, self.is_transient = reason, object_, is_transient


@dataclass(frozen=True)
class Checksum:
    kind: str  # sha256 | git-sha1 | md5 | s3-multipart
    value: str
    part_bytes: int = 0  # s3-multipart: the size of every part but the last


@dataclass(frozen=True)
class RemoteFile:
    path: str  # relative to the model directory, POSIX
    size: int
    checksum: Checksum | None  # None: the source has no checksum for it (refused unless a manifest has)


@dataclass(frozen=True)
class Listing:
    resolved: str  # the commit sha, or the objects' digest
    files: tuple[RemoteFile, ...]


class Source(Protocol):
    description: str  # hf://repo@revision or s3://bucket/prefix, for messages

    def list(self) -> Listing: ...

    def download(self, file: RemoteFile, staging: Path) -> Path:
        """Fetch `file` into `staging` (resuming what a cut or an earlier run left); its path there."""
        ...
