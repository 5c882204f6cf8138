"""`kembed-worker fetch-model URI --dest DIR`: a model from the Hugging Face Hub (`hf://REPO@REVISION`)
or S3 (`s3://BUCKET/PREFIX`) into a directory, before a worker or gateway starts (an init container,
or once per revision a cache Job into a shared claim; the operator renders both).

- **Resolved first**: a branch or tag to its commit sha, an S3 prefix to a digest of its objects'
  keys, sizes and ETags. `--resolve-only` stops there (the operator's resolve Job: the revision hash
  includes what was resolved); `--expect` refuses to fetch anything else than what was resolved then.
- **Only what serving reads**: the safetensors and the JSON/tokenizer files by default (`--files`
  narrows or widens it); pickled weights (.bin, .pt, ...) are never written, whatever is asked.
- **Parallel and resumable**: `--parallel` files at a time into a staging directory beside DEST whose
  name is fixed, so a restarted pod (or Job retry) carries on from the bytes already there.
- **Verified**: every file against the Hub's LFS sha256 or git blob sha1, S3's ETag (MD5, or the MD5
  of part MD5s) or a SHA256SUMS file under the prefix; a mismatch is deleted and fetched once more,
  then refused.
- **Atomic**: the staging directory is renamed to DEST only once every file is verified, with a
  manifest (.kembed-model.json) inside: a half-downloaded model is never served.

The outcome, success or failure, is one JSON object in `--report` (the pod's termination message, which
the operator reads: a resolve's answer, or ModelFetchFailed's source, object and reason) and one line on
stderr. Exit 0: done; 1: a verdict that retrying will not change (forbidden, not found, checksum, disk
full, refused); 2: transient (network, server errors), worth a retry.
"""

from __future__ import annotations

import argparse
import errno
import fnmatch
import hashlib
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
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
REPORT_MESSAGE_CHARS = 1500  # a termination message holds 4096 bytes


# --- choosing files -----------------------------------------------------------------------------


def is_pickled(path: str) -> bool:
    return path.lower().endswith(PICKLED_SUFFIXES)


def select(files: Sequence[RemoteFile], patterns: Sequence[str], skip_weights: bool) -> list[RemoteFile]:
    """The files to fetch: matching `patterns`, never a pickle, never a path out of the directory."""
    chosen = []
    for file in files:
        parts = PurePosixPath(file.path).parts
        if file.path.startswith("/") or ".." in parts or not parts:
            raise FetchError("refused", f"{file.path!r} is not a path inside the model directory", file.path)
        if is_pickled(file.path) or not any(fnmatch.fnmatch(file.path, p) for p in patterns):
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


def fetch(
    source: Source,
    dest: Path,
    patterns: Sequence[str] = DEFAULT_FILES,
    *,
    expect: str = "",
    skip_weights: bool = False,
    parallel: int = 8,
    resolve_only: bool = False,
) -> Outcome:
    listing = source.list()
    if expect and listing.resolved != expect:
        raise FetchError(
            "changed",
            f"{source.description} is now {listing.resolved}, not {expect} as resolved for this revision: "
            "the operator resolves it again",
        )
    chosen = select(listing.files, patterns, skip_weights)
    check_servable(chosen, listing.files, skip_weights)
    total = sum(f.size for f in chosen)
    if resolve_only:
        return Outcome(listing.resolved, len(chosen), total, False)
    if _is_fetched(dest, listing.resolved):
        return Outcome(listing.resolved, len(chosen), total, True)
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


def _is_fetched(dest: Path, resolved: str) -> bool:
    try:
        return bool(json.loads((dest / MANIFEST).read_text())["resolved"] == resolved)
    except (OSError, ValueError, KeyError):
        return False


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


# --- the command --------------------------------------------------------------------------------


def source_of(uri: str, args: argparse.Namespace) -> Source:
    if uri.startswith("hf://"):
        from kembed.worker.tools.fetch_hub import HubSource

        repo, _, revision = uri.removeprefix("hf://").partition("@")
        return HubSource(repo, revision or "main", endpoint=args.endpoint)
    if uri.startswith("s3://"):
        from kembed.worker.tools.fetch_s3 import S3Source

        bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        return S3Source(bucket, prefix, endpoint_url=args.endpoint, region=args.region)
    raise FetchError("refused", f"{uri!r}: a source is hf://REPO[@REVISION] or s3://BUCKET[/PREFIX]")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kembed-worker fetch-model",
        description="Fetch a model from the Hugging Face Hub or S3 into a directory: resolved, "
        "verified, atomic. The Hub token is HF_TOKEN; S3 credentials the AWS_* variables (or the pod's "
        "identity).",
    )
    p.add_argument("uri", help="hf://REPO[@REVISION] or s3://BUCKET[/PREFIX]")
    p.add_argument("--dest", type=Path, help="the model directory to create (its parent must exist)")
    p.add_argument(
        "--files", default="", help=f"comma-separated glob patterns (default: {','.join(DEFAULT_FILES)})"
    )
    p.add_argument("--expect", default="", help="refuse unless the source still resolves to this")
    p.add_argument("--resolve-only", action="store_true", help="resolve and list, fetch nothing")
    p.add_argument("--skip-weights", action="store_true", help="all but the safetensors (a gateway's files)")
    p.add_argument("--parallel", type=int, default=8, help="files fetched at a time (default 8)")
    p.add_argument(
        "--endpoint", default="", help="the Hub's or the S3 endpoint's URL (default: the public one)"
    )
    p.add_argument("--region", default="", help="S3 region")
    p.add_argument("--report", type=Path, help="where to write the JSON outcome (a termination message)")
    return p


def main(argv: Sequence[str], *, clock: Callable[[], float] = time.monotonic) -> int:
    args = parser().parse_args(list(argv)[1:])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    started = clock()
    patterns = [p.strip() for p in args.files.split(",") if p.strip()] or list(DEFAULT_FILES)
    report: dict[str, object] = {"source": args.uri}
    try:
        if args.dest is None and not args.resolve_only:
            raise FetchError("refused", "--dest is needed unless --resolve-only")
        source = source_of(args.uri, args)
        report["source"] = source.description
        outcome = fetch(
            source,
            args.dest or Path("."),
            patterns,
            expect=args.expect,
            skip_weights=args.skip_weights,
            parallel=args.parallel,
            resolve_only=args.resolve_only,
        )
        report |= {
            "ok": True,
            "resolved": outcome.resolved,
            "files": outcome.num_files,
            "bytes": outcome.num_bytes,
            "present": outcome.was_present,
            "seconds": round(clock() - started, 1),
        }
        what = "resolved" if args.resolve_only else ("already there" if outcome.was_present else "fetched")
        print(
            f"fetch-model: {source.description} {what}: {outcome.resolved}, {outcome.num_files} files, "
            f"{outcome.num_bytes} bytes",
            file=sys.stderr,
        )
        code = 0
    except FetchError as error:
        report |= {
            "ok": False,
            "reason": error.reason,
            "object": error.object,
            "message": str(error)[:REPORT_MESSAGE_CHARS],
        }
        print(f"fetch-model: {report['source']}: {error.reason}: {error}", file=sys.stderr)
        code = 2 if error.is_transient else 1
    if args.report is not None:
        args.report.write_text(json.dumps(report, sort_keys=True))
    return code
