"""What `kembed-worker fetch-model URI --dest DIR` (the command: fetch_command.py) does: a model from
the Hugging Face Hub (`hf://REPO@REVISION`) or S3 (`s3://BUCKET/PREFIX`) into a directory, before a
worker or gateway starts (an init container, or once per revision a cache Job into a shared claim;
the operator renders both).

- **Resolved first**: a branch or tag to its commit sha, an S3 prefix to a digest of the keys, sizes
  and ETags of the objects it would fetch (nothing else under the prefix counts), plus a pin (the
  objects' VersionIds or ETags). `--resolve-only` stops there (the operator's resolve Job: the
  revision hash includes what was resolved).
- **Pinned**: `--expect` (and for S3 `--pin`) fetch exactly what was resolved then: the Hub commit
  itself (a branch that moved since changes nothing), the pinned S3 versions, or, in a bucket
  without versions, the same objects while they are unchanged, an object replaced since refused by
  name. A DEST already holding that fetch is kept without asking the source anything.
- **Only what serving reads**: the safetensors and the JSON/tokenizer files by default (`--files`
  narrows or widens it); pickled weights (.bin, .pt, ...) are never written, whatever is asked.
- **Parallel and resumable**: `--parallel` files at a time into a staging directory beside DEST whose
  name is fixed, so a restarted pod (or Job retry) carries on from the bytes already there.
- **Verified**: every file against the Hub's LFS sha256 or git blob sha1, S3's ETag (MD5, or the MD5
  of part MD5s) or a SHA256SUMS file under the prefix; a mismatch is deleted and fetched once more,
  then refused.
- **Atomic**: the staging directory is renamed to DEST only once every file is verified, with a
  manifest (.kembed-model.json) inside: a half-downloaded model is never served.
"""

from __future__ import annotations

import errno
import fnmatch
import functools
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from kembed.worker.tools.fetch_source import CHUNK_BYTES, Checksum, FetchError, Listing, RemoteFile, Source

log = logging.getLogger("kembed.worker.fetch")

# What serving reads (engine and gateway): weights, configs, tokenizers, sentence-transformers modules.
DEFAULT_FILES = ("*.safetensors", "*.json", "*vocab.txt", "*merges.txt", "*.model")
# What a gateway reads: all of it but the weights.
WEIGHT_FILES = ("*.safetensors",)
PICKLED_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib")
MANIFEST = ".kembed-model.json"
STAGING_MARK = ".kembed-staging.json"
MAX_FILE_ATTEMPTS = 5  # per file: cuts resumed, a checksum mismatch fetched once more


# --- choosing files -----------------------------------------------------------------------------


def is_pickled(path: str) -> bool:
    return path.lower().endswith(PICKLED_SUFFIXES)


def is_wanted(path: str, patterns: Sequence[str]) -> bool:
    """Whether `path` is fetched (weights included): what an S3 resolution counts."""
    return not is_pickled(path) and any(fnmatch.fnmatch(path, p) for p in patterns)


def select(files: Sequence[RemoteFile], patterns: Sequence[str], skip_weights: bool) -> list[RemoteFile]:
    """The files to fetch: matching `patterns`, never a pickle, never a path out of the directory."""
    chosen = []
    for file in files:
        parts = PurePosixPath(file.path).parts
        if file.path.startswith("/") or ".." in parts or not parts:
            raise FetchError("refused", f"{file.path!r} is not a path inside the model directory", file.path)
        if not is_wanted(file.path, patterns):
            continue
        if skip_weights and any(fnmatch.fnmatch(file.path, p) for p in WEIGHT_FILES):
            continue
        chosen.append(file)
    return chosen


def check_servable(chosen: Sequence[RemoteFile], every: Sequence[RemoteFile], skip_weights: bool) -> None:
    names = {f.path for f in chosen}
    if "config.json" not in names:
        raise FetchError("not_found", "no config.json among the files chosen: not a model directory")
    if not skip_weights and not any(n.endswith(".safetensors") for n in names):
        pickled = sorted(f.path for f in every if is_pickled(f.path))
        hint = (
            f" (there are pickled weights, {', '.join(pickled[:3])}: convert them to safetensors)"
            if pickled
            else ""
        )
        raise FetchError("refused", f"no safetensors weights among the files chosen{hint}")


# --- verifying ----------------------------------------------------------------------------------


def digest_of(path: Path, checksum: Checksum) -> str:
    """`path`'s digest in the checksum's own terms."""
    if checksum.kind == "s3-multipart":
        parts = []
        with path.open("rb") as f:
            while block := f.read(checksum.part_bytes):
                parts.append(hashlib.md5(block, usedforsecurity=False).digest())
        return f"{hashlib.md5(b''.join(parts), usedforsecurity=False).hexdigest()}-{len(parts)}"
    if checksum.kind == "git-sha1":
        h = hashlib.sha1(f"blob {path.stat().st_size}\0".encode(), usedforsecurity=False)
    elif checksum.kind == "md5":
        h = hashlib.md5(usedforsecurity=False)
    else:
        h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK_BYTES * 8):
            h.update(block)
    return h.hexdigest()


def verify(file: RemoteFile, path: Path) -> None:
    size = path.stat().st_size
    if size != file.size:
        raise FetchError("checksum", f"{file.path}: {size} bytes, the source says {file.size}", file.path)
    assert file.checksum is not None, "files without a checksum are refused before they are fetched"
    got = digest_of(path, file.checksum)
    if got != file.checksum.value:
        raise FetchError(
            "checksum",
            f"{file.path}: {file.checksum.kind} {got} does not match the source's {file.checksum.value}",
            file.path,
        )


# --- the fetch ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    resolved: str
    num_files: int
    num_bytes: int
    was_present: bool
    pin: str = ""  # what a later fetch of the same resolution passes as --pin


def fetch(
    source: Source,
    dest: Path,
    patterns: Sequence[str] = DEFAULT_FILES,
    *,
    expect: str = "",
    pin: str = "",
    skip_weights: bool = False,
    parallel: int = 8,
    resolve_only: bool = False,
) -> Outcome:
    if expect and not resolve_only and (present := _fetched(dest, expect)) is not None:
        return present  # a restarted pod's volume, or a cache Job's claim: nothing to ask the source
    wanted = functools.partial(is_wanted, patterns=patterns)
    listing = source.pinned(expect, pin, wanted) if expect else source.list(wanted)
    if expect and listing.resolved != expect:
        raise FetchError(
            "changed",
            f"{source.description} is now {listing.resolved}, not {expect} as resolved for this revision "
            "(and no pin says what to fetch instead): something it fetches changed since",
        )
    chosen = select(listing.files, patterns, skip_weights)
    check_servable(chosen, listing.files, skip_weights)
    total = sum(f.size for f in chosen)
    if resolve_only:
        return Outcome(listing.resolved, len(chosen), total, False, listing.pin)
    if (present := _fetched(dest, listing.resolved)) is not None:
        return present
    if dest.exists():
        raise FetchError("refused", f"{dest} exists and holds no fetch of {listing.resolved}", str(dest))
    staging = _staging(dest, listing.resolved)
    free = shutil.disk_usage(staging).free
    needed = total - _bytes_in(staging)
    if needed > free:
        raise FetchError(
            "disk_full",
            f"{total} bytes to fetch ({needed} still), {free} free in {staging.parent}",
            str(dest),
        )
    unverified = [f.path for f in chosen if f.checksum is None]
    if unverified:
        raise FetchError(
            "unverified",
            f"no checksum for {', '.join(unverified[:3])} (an ETag that is not an MD5, as with SSE-KMS): "
            "put a SHA256SUMS file beside them",
            unverified[0],
        )
    with ThreadPoolExecutor(max(1, parallel), thread_name_prefix="fetch") as pool:
        # largest first: the long downloads start at once, the small files fill in around them
        for _ in pool.map(lambda f: _fetch_one(source, f, staging), sorted(chosen, key=lambda f: -f.size)):
            pass
    _finish(source, listing, chosen, staging, dest)
    return Outcome(listing.resolved, len(chosen), total, False)


def _fetch_one(source: Source, file: RemoteFile, staging: Path) -> None:
    for attempt in range(1, MAX_FILE_ATTEMPTS + 1):
        try:
            path = source.download(file, staging)
            verify(file, path)
            return
        except FetchError as error:
            if error.reason == "checksum" and attempt < 2:  # a bad cached copy or a flipped bit: once more
                log.warning("%s; fetching it again", error)
                (staging / file.path).unlink(missing_ok=True)
                continue
            if not error.is_transient or attempt == MAX_FILE_ATTEMPTS:
                raise
            log.warning("%s (attempt %d of %d); resuming", error, attempt, MAX_FILE_ATTEMPTS)
            time.sleep(min(8.0, 0.5 * 2**attempt))
        except OSError as error:
            if error.errno == errno.ENOSPC:
                raise FetchError(
                    "disk_full", f"{file.path}: no space left on the device", file.path
                ) from None
            raise


def _fetched(dest: Path, resolved: str) -> Outcome | None:
    """The fetch of `resolved` already at `dest` (its manifest says so), or None."""
    try:
        manifest = json.loads((dest / MANIFEST).read_text())
        if manifest["resolved"] != resolved:
            return None
        sizes = [int(f["size"]) for f in manifest["files"].values()]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return Outcome(resolved, len(sizes), sum(sizes), True)


def _staging(dest: Path, resolved: str) -> Path:
    """The fixed-name staging directory beside `dest`: resumed when it holds the same resolution."""
    staging = dest.parent / f".{dest.name}.partial"
    mark = staging / STAGING_MARK
    try:
        if json.loads(mark.read_text())["resolved"] != resolved:
            shutil.rmtree(staging)  # left by another resolution: nothing in it is ours
    except (OSError, ValueError, KeyError):
        if staging.exists():
            shutil.rmtree(staging)
    staging.mkdir(parents=True, exist_ok=True)
    mark.write_text(json.dumps({"resolved": resolved}))
    return staging


def _bytes_in(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def _finish(
    source: Source, listing: Listing, chosen: Sequence[RemoteFile], staging: Path, dest: Path
) -> None:
    """Keep only the chosen files, write the manifest, flush, rename: DEST appears whole or not at all."""
    wanted = {staging / f.path for f in chosen}
    for path in sorted(staging.rglob("*"), reverse=True):  # the clients' own bookkeeping goes
        if path.is_file() and path not in wanted:
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()
    manifest = {
        "source": source.description,
        "resolved": listing.resolved,
        "files": {
            f.path: {"size": f.size, **({f.checksum.kind: f.checksum.value} if f.checksum else {})}
            for f in sorted(chosen, key=lambda f: f.path)
        },
    }
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=1))
    for path in [*wanted, staging / MANIFEST]:
        with path.open("rb") as f:
            os.fsync(f.fileno())
    os.rename(staging, dest)
    directory = os.open(dest.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
