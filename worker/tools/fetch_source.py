"""What fetch-model asks of a model source (the Hub: fetch_hub.py, S3: fetch_s3.py), and what a
source answers: its files with their checksums, resolved to one commit or digest, with the pin a later
fetch asks for to get exactly those files again; `FetchError`, one word of reason per failure."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

CHUNK_BYTES = 1 << 20  # a download's read size
# 30 s: a Hub or S3 answer that has not begun (or paused) that long is not coming; a model-info call
# or a HEAD answers in well under a second, and a download's next bytes come within milliseconds.
DEFAULT_TIMEOUT_S = 30.0

Wanted = Callable[
    [str], bool
]  # whether fetch-model fetches a path: its file selection (patterns, no pickles)


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
    resolved: str  # the commit sha, or the digest of the objects fetch-model fetches
    files: tuple[RemoteFile, ...]
    # What a later fetch passes back (`--pin`) to get exactly these files whatever moved since: ""
    # for the Hub (the commit sha is its own pin); for S3 the objects' VersionIds or ETags.
    pin: str = ""


class Source(Protocol):
    description: str  # hf://repo@revision or s3://bucket/prefix, for messages

    def list(self, wanted: Wanted) -> Listing:
        """The source as it is now: resolved (from the `wanted` files only) and pinned."""
        ...

    def pinned(self, resolved: str, pin: str, wanted: Wanted) -> Listing:
        """What an earlier `list` answered (its `resolved` and `pin`): the same files, whatever
        moved since, or FetchError("changed") naming an object that can no longer be had."""
        ...

    def download(self, file: RemoteFile, staging: Path) -> Path:
        """Fetch `file` into `staging` (resuming what a cut or an earlier run left); its path there."""
        ...
