"""`kembed-worker fetch-model URI --dest DIR`: the command around model_fetch.py's fetch. Its flags
become one frozen `FetchSettings`; the source is made from the URI (hf:// or s3://).

The outcome, success or failure, is one JSON object in `--report` (the pod's termination message, which
the operator reads: a resolve's answer and pin, or ModelFetchFailed's source, object and reason) and
one line on stderr. Exit 0: done; 1: a verdict that retrying will not change (forbidden, not found,
checksum, disk full, refused, changed); 2: transient (network, server errors, timeouts, the
deadline), worth a retry, which resumes from the bytes already staged.

Two bounds, so that a fetch never hangs a pod: every network call waits at most `--timeout-s` for
an answer (an unanswering Hub or bucket is exit 2, `network`), and the whole run ends at
`--deadline-s` (exit 2, `deadline`) with the report written: an init container cannot carry a
Kubernetes deadline of its own without one that kills the pod's long-running container too.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kembed.worker.tools.fetch_source import DEFAULT_TIMEOUT_S, FetchError, Source
from kembed.worker.tools.model_fetch import DEFAULT_FILES, fetch

log = logging.getLogger("kembed.worker.fetch")

REPORT_MESSAGE_CHARS = 1500  # a failure's message; the whole report is a termination message:
TERMINATION_MESSAGE_BYTES = 4096  # what Kubernetes keeps of one


@dataclass(frozen=True)
class FetchSettings:
    """How long a fetch may take, read once from the flags."""

    # Seconds one network call waits to connect, or for the next bytes of its answer (S3: botocore
    # tries a call 3 times). 30 s: a Hub or S3 answer that has not begun that long is not coming.
    timeout_s: float = DEFAULT_TIMEOUT_S
    # Seconds the whole run may take, 0 for no bound. Unbounded by default: the operator sets one per
    # container (a resolve, a pod's fetch, a cache Job), knowing what it waits for.
    deadline_s: float = 0.0


def source_of(uri: str, args: argparse.Namespace, settings: FetchSettings) -> Source:
    if uri.startswith("hf://"):
        from kembed.worker.tools.fetch_hub import HubSource

        repo, _, revision = uri.removeprefix("hf://").partition("@")
        return HubSource(repo, revision or "main", endpoint=args.endpoint, timeout_s=settings.timeout_s)
    if uri.startswith("s3://"):
        from kembed.worker.tools.fetch_s3 import S3Source

        bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        return S3Source(
            bucket, prefix, endpoint_url=args.endpoint, region=args.region, timeout_s=settings.timeout_s
        )
    raise FetchError("refused", f"{uri!r}: a source is hf://REPO[@REVISION] or s3://BUCKET[/PREFIX]")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kembed-worker fetch-model",
        description="Fetch a model from the Hugging Face Hub or S3 into a directory: resolved, pinned, "
        "verified, atomic. The Hub token is HF_TOKEN; S3 credentials the AWS_* variables (or the pod's "
        "identity).",
    )
    p.add_argument("uri", help="hf://REPO[@REVISION] or s3://BUCKET[/PREFIX]")
    p.add_argument("--dest", type=Path, help="the model directory to create (its parent must exist)")
    p.add_argument(
        "--files", default="", help=f"comma-separated glob patterns (default: {','.join(DEFAULT_FILES)})"
    )
    p.add_argument(
        "--expect",
        default="",
        help="what an earlier --resolve-only answered (its 'resolved'): fetch exactly that (the Hub "
        "commit itself, whatever the branch points at now)",
    )
    p.add_argument(
        "--pin",
        default="",
        help="with --expect, for S3: the resolve's 'pin' (the objects' versions or ETags)",
    )
    p.add_argument("--resolve-only", action="store_true", help="resolve and list, fetch nothing")
    p.add_argument("--skip-weights", action="store_true", help="all but the safetensors (a gateway's files)")
    p.add_argument("--parallel", type=int, default=8, help="files fetched at a time (default 8)")
    p.add_argument(
        "--endpoint", default="", help="the Hub's or the S3 endpoint's URL (default: the public one)"
    )
    p.add_argument("--region", default="", help="S3 region")
    p.add_argument(
        "--timeout-s",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"seconds a network call waits for an answer (default {DEFAULT_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--deadline-s", type=float, default=0.0, help="seconds the whole run may take; 0: no bound (default)"
    )
    p.add_argument("--report", type=Path, help="where to write the JSON outcome (a termination message)")
    return p


class _Report:
    """The run's one outcome: written by the fetch or by the deadline's timer, whichever is first."""

    def __init__(self, path: Path | None) -> None:
        self._path, self._lock, self._is_written = path, threading.Lock(), False

    def write(self, report: dict[str, Any], line: str) -> bool:
        with self._lock:
            if self._is_written:
                return False
            self._is_written = True
            print(line, file=sys.stderr, flush=True)
            if self._path is not None:
                self._path.write_text(json.dumps(report, sort_keys=True))
            return True


def _fitted(report: dict[str, Any]) -> dict[str, Any]:
    """`report` within a termination message: a pin of too many objects is left out (the fetch then
    needs the prefix unchanged: it compares the digest), and said so."""
    if len(json.dumps(report, sort_keys=True).encode()) <= TERMINATION_MESSAGE_BYTES or not report.get("pin"):
        return report
    num_objects = len(json.loads(str(report["pin"]))["objects"])
    log.warning("the pin of %d objects does not fit a termination message: left out", num_objects)
    return {k: v for k, v in report.items() if k != "pin"} | {
        "unpinned": f"{num_objects} objects: too many to pin in a termination message"
    }


def main(argv: Sequence[str], *, clock: Callable[[], float] = time.monotonic) -> int:
    args = parser().parse_args(list(argv)[1:])
    settings = FetchSettings(timeout_s=args.timeout_s, deadline_s=args.deadline_s)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    started = clock()
    patterns = [p.strip() for p in args.files.split(",") if p.strip()] or list(DEFAULT_FILES)
    report: dict[str, Any] = {"source": args.uri}
    out = _Report(args.report)
    timer = None
    if settings.deadline_s > 0:
        timer = threading.Timer(settings.deadline_s, _on_deadline, (out, report, settings.deadline_s))
        timer.daemon = True
        timer.start()
    try:
        if args.dest is None and not args.resolve_only:
            raise FetchError("refused", "--dest is needed unless --resolve-only")
        if args.pin and not args.expect:
            raise FetchError("refused", "--pin goes with --expect (both from one resolve)")
        source = source_of(args.uri, args, settings)
        report["source"] = source.description
        outcome = fetch(
            source,
            args.dest or Path("."),
            patterns,
            expect=args.expect,
            pin=args.pin,
            skip_weights=args.skip_weights,
            parallel=args.parallel,
            resolve_only=args.resolve_only,
        )
        done = report | {
            "ok": True,
            "resolved": outcome.resolved,
            "files": outcome.num_files,
            "bytes": outcome.num_bytes,
            "present": outcome.was_present,
            "seconds": round(clock() - started, 1),
        }
        if outcome.pin and args.resolve_only:
            done["pin"] = outcome.pin
        what = "resolved" if args.resolve_only else ("already there" if outcome.was_present else "fetched")
        line = (
            f"fetch-model: {source.description} {what}: {outcome.resolved}, {outcome.num_files} files, "
            f"{outcome.num_bytes} bytes"
        )
        out.write(_fitted(done), line)
        code = 0
    except FetchError as error:
        failed = report | {
            "ok": False,
            "reason": error.reason,
            "object": error.object,
            "message": str(error)[:REPORT_MESSAGE_CHARS],
        }
        out.write(failed, f"fetch-model: {report['source']}: {error.reason}: {error}")
        code = 2 if error.is_transient else 1
    if timer is not None:
        timer.cancel()
    return code


def _on_deadline(out: _Report, report: dict[str, Any], deadline_s: float) -> None:
    """The deadline passed with the fetch still running (its threads block in reads that cannot be
    cancelled): say so in the report, then end the process; the staged bytes stay for the next run."""
    message = (
        f"{report['source']}: not done within its deadline of {deadline_s:g} s (--deadline-s); what "
        "was fetched is staged, and the next run resumes from it"
    )
    failed = report | {"ok": False, "reason": "deadline", "object": "", "message": message}
    if out.write(failed, f"fetch-model: deadline: {message}"):
        logging.shutdown()
        os._exit(2)
