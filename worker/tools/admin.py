"""`python -m kembed.worker stats|prewarm|smoke`: the worker image's own tools against running workers.

The operator's rollout Jobs run these against every candidate pod (it imports no kembed code; it
runs the image's commands):
- `stats --target ADDR`: per-bucket hit counts and capture state;
- `prewarm --target ADDR... [--buckets 1x128,8x512] [--hot-from ADDR... --hot N]`: capture the listed
  buckets plus the N buckets the serving revision's workers hit most;
- `smoke --target ADDR... [--buckets ...] [--min-cosine 0.999] [--golden FILE|DIR] [--expect-device
  cuda]`: check each worker serves on the device asked for (its Info), replay captured graphs against
  eager runs, and embed golden token ids against their expected embeddings; exits 1 with a readable
  report when any check fails.
Exit status: 0 success, 1 a check failed, 2 a worker could not be reached or the arguments are wrong.
Against workers with a shared token, each command sends it with every call: `--auth-token-file FILE`,
else KEMBED_WORKER_AUTH_TOKEN (the worker's own setting, so a Job can take the worker's Secret).
"""

import argparse
import json
import os
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import grpc
import numpy as np

from kembed.proto import embedder_pb2 as pb
from kembed.proto import embedder_pb2_grpc as pb_grpc
from kembed.proto.accuracy import MIN_COSINE
from kembed.worker.buckets import Bucket
from kembed.worker.cli import COMMANDS, program_name
from kembed.worker.edge.auth import bearer

Metadata = Sequence[tuple[str, str]]
GoldenCase = tuple[str, list[list[int]], np.ndarray]


CONNECT_TIMEOUT_S = 10.0  # a worker that is up accepts at once; one that is not should say so soon


class Unreachable(Exception):
    """No worker accepted a connection at the address in time."""


def _stub(address: str, connect_timeout_s: float = CONNECT_TIMEOUT_S) -> pb_grpc.EmbedderStub:
    channel = grpc.insecure_channel(address)
    try:
        grpc.channel_ready_future(channel).result(timeout=connect_timeout_s)
    except grpc.FutureTimeoutError:
        channel.close()
        raise Unreachable(
            f"worker unreachable: none answered at {address} within {connect_timeout_s:g} s"
        ) from None
    return pb_grpc.EmbedderStub(channel)


def _connect_timeout(args: argparse.Namespace) -> float:
    """A connection waits --connect-timeout, and no longer than a whole call may (--timeout)."""
    return float(min(args.connect_timeout, args.timeout))


def _buckets(text: str) -> list[Bucket]:
    try:
        return [Bucket.parse(item) for item in text.split(",") if item.strip()]
    except ValueError:
        message = f"buckets are SEQSxTOKENS, comma-separated (e.g. 1x128,8x512): {text!r}"
        raise argparse.ArgumentTypeError(message) from None


def _pb(bucket: Bucket) -> pb.Bucket:
    return pb.Bucket(num_sequences=bucket.num_seqs, num_tokens=bucket.num_tokens)


def _bucket(message: pb.Bucket) -> Bucket:
    return Bucket(message.num_sequences, message.num_tokens)


def hot_buckets(
    addresses: list[str],
    count: int,
    timeout_s: float,
    metadata: Metadata = (),
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
) -> list[Bucket]:
    """The `count` buckets with the most hits summed over the serving workers at `addresses`."""
    hits: Counter[Bucket] = Counter()
    for address in addresses:
        stub = _stub(address, connect_timeout_s)
        for stat in stub.BucketStats(pb.BucketStatsRequest(), timeout=timeout_s, metadata=metadata).buckets:
            hits[_bucket(stat.bucket)] += stat.hits
    return [bucket for bucket, n in hits.most_common(count) if n > 0]


def run_stats(args: argparse.Namespace) -> int:
    stats = _stub(args.target[0], _connect_timeout(args)).BucketStats(
        pb.BucketStatsRequest(), timeout=args.timeout, metadata=args.metadata
    )
    print(f"{'bucket':>12} {'hits':>10} captured")
    for stat in sorted(stats.buckets, key=lambda s: -s.hits):
        print(f"{_bucket(stat.bucket)!s:>12} {stat.hits:>10} {'yes' if stat.captured else 'no'}")
    return 0


def run_prewarm(args: argparse.Namespace) -> int:
    hot = [
        b
        for b in hot_buckets(args.hot_from, args.hot, args.timeout, args.metadata, _connect_timeout(args))
        if b not in args.buckets
    ]
    if not args.buckets and not hot:
        print("prewarm: nothing to capture (no buckets listed, none hot)")
        return 0
    failed = False
    for address in args.target:
        stub = _stub(address, _connect_timeout(args))
        # The listed buckets must all be the target's; a hot bucket of the serving revision may not be
        # (other budgets): it is skipped, with a note, rather than failing the rollout.
        listed = pb.PrewarmRequest(buckets=[_pb(b) for b in args.buckets])
        replies = [stub.Prewarm(listed, timeout=args.timeout, metadata=args.metadata)]
        for bucket in hot:
            try:
                one = pb.PrewarmRequest(buckets=[_pb(bucket)])
                replies.append(stub.Prewarm(one, timeout=args.timeout, metadata=args.metadata))
            except grpc.RpcError as error:
                if error.code() != grpc.StatusCode.INVALID_ARGUMENT:
                    raise
                print(f"prewarm {address}: skipped hot bucket {bucket}: {error.details()}")
        captured = ", ".join(str(_bucket(b)) for reply in replies for b in reply.captured) or "none"
        print(f"prewarm {address}: captured {captured}")
        for message in (message for reply in replies for message in reply.errors):
            print(f"prewarm {address}: ERROR {message}")
            failed = True
    return 1 if failed else 0


def load_golden(path: Path) -> list[GoldenCase]:
    """Golden cases from a JSON file, or every *.json in a directory (a mounted ConfigMap): each
    `{"token_ids": [[...], ...], "embeddings": [[...], ...]}`, one embedding per sequence."""
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    cases: list[GoldenCase] = []
    for file in files:
        data = json.loads(file.read_text())
        token_ids, embeddings = data["token_ids"], np.asarray(data["embeddings"], dtype=np.float32)
        if len(token_ids) != len(embeddings) or not token_ids:
            raise ValueError(f"{file}: need one embedding per token-id sequence, and at least one")
        cases.append((file.name, token_ids, embeddings))
    return cases


def check_golden(
    stub: pb_grpc.EmbedderStub,
    cases: list[GoldenCase],
    min_cosine: float,
    timeout_s: float,
    metadata: Metadata = (),
) -> list[str]:
    """One report line per golden file; lines starting with FAIL are failures."""
    lines = []
    for name, token_ids, expected in cases:
        ids = np.concatenate([np.asarray(seq, dtype="<i4") for seq in token_ids])
        batch = pb.TokenBatch(token_ids=ids.tobytes(), lengths=[len(seq) for seq in token_ids])
        request = pb.EmbedRequest(batch=batch, request_id=f"golden/{name}")
        reply = stub.Embed(request, timeout=timeout_s, metadata=metadata)
        got = np.frombuffer(reply.embeddings, dtype="<f4").reshape(reply.num_sequences, reply.dimensions)
        if got.shape != expected.shape:
            lines.append(f"FAIL golden {name}: shape {got.shape}, expected {expected.shape}")
            continue
        norms = np.linalg.norm(got, axis=1) * np.linalg.norm(expected, axis=1)
        worst = float(np.nan_to_num((got * expected).sum(1) / np.maximum(norms, 1e-30), nan=-1.0).min())
        verdict = "ok  " if worst >= min_cosine else "FAIL"
        lines.append(f"{verdict} golden {name}: {len(token_ids)} sequences, min cosine {worst:.6f}")
    return lines


def run_smoke(args: argparse.Namespace) -> int:
    failed = False
    golden = load_golden(args.golden) if args.golden else []
    for address in args.target:
        if args.expect_device:
            info = _stub(address, _connect_timeout(args)).Info(
                pb.InfoRequest(), timeout=args.timeout, metadata=args.metadata
            )
            if info.device.split(":")[0] != args.expect_device:
                print(f"smoke {address}: FAILED: serves on {info.device!r}, not {args.expect_device!r}")
                failed = True
                continue
        request = pb.SmokeTestRequest(
            buckets=[_pb(b) for b in args.buckets], min_cosine=args.min_cosine, seed=args.seed
        )
        reply = _stub(address, _connect_timeout(args)).SmokeTest(
            request, timeout=args.timeout, metadata=args.metadata
        )
        print(f"smoke {address}: {'PASSED' if reply.passed else 'FAILED'} ({len(reply.results)} buckets)")
        for result in reply.results:
            verdict = "ok  " if result.passed else "FAIL"
            nonfinite = ", NaN/Inf in output" if result.has_nonfinite else ""
            print(
                f"  {verdict} {_bucket(result.bucket)!s:>12}  min cosine {result.min_cosine:.6f}{nonfinite}"
            )
        if not reply.results:
            print("  no bucket was tested: nothing captured and none listed")
        failed |= not reply.passed
        stub = _stub(address, _connect_timeout(args))
        for line in check_golden(stub, golden, args.min_cosine, args.timeout, args.metadata):
            print(f"  {line}")
            failed |= line.startswith("FAIL")
    return 1 if failed else 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command, its flags and the token's call metadata (`metadata`); exits 2 on bad ones."""
    parser = argparse.ArgumentParser(prog=program_name(), description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("stats", "prewarm", "smoke"):
        helptext = COMMANDS[name][1]
        sub = commands.add_parser(name, help=helptext, description=helptext)
        sub.add_argument(
            "--target", action="append", required=True, metavar="ADDR", help="worker host:port (repeatable)"
        )
        sub.add_argument(
            "--timeout",
            type=float,
            default=600.0,
            help="seconds a worker call may take once connected (default: %(default)s: a prewarm of "
            "hundreds of buckets takes minutes)",
        )
        sub.add_argument(
            "--connect-timeout",
            type=float,
            default=CONNECT_TIMEOUT_S,
            help="seconds to wait for each worker to accept a connection (default: %(default)s)",
        )
        sub.add_argument(
            "--auth-token-file",
            type=Path,
            default=None,
            metavar="PATH",
            help="file holding the workers' shared token (default: KEMBED_WORKER_AUTH_TOKEN; none)",
        )
        if name in ("prewarm", "smoke"):
            sub.add_argument(
                "--buckets",
                type=_buckets,
                default=[],
                metavar="BUCKETS",
                help="buckets to capture or test, SEQSxTOKENS comma-separated, e.g. 1x128,8x512 "
                + ("(default: none)" if name == "prewarm" else "(default: every captured bucket)"),
            )
        if name == "prewarm":
            sub.add_argument(
                "--hot-from",
                action="append",
                default=[],
                metavar="ADDR",
                help="serving worker whose hottest buckets to carry over (repeatable)",
            )
            sub.add_argument(
                "--hot",
                type=int,
                default=8,
                metavar="N",
                help="how many of their most-hit buckets to carry over (default: %(default)s)",
            )
        if name == "smoke":
            sub.add_argument(
                "--min-cosine",
                type=float,
                default=MIN_COSINE,
                metavar="X",
                help="least cosine of each replayed row to its eager run, and of each golden row to its "
                "expected embedding (default: %(default)s)",
            )
            sub.add_argument(
                "--seed", type=int, default=0, help="seed of the random test inputs (default: %(default)s)"
            )
            sub.add_argument(
                "--expect-device",
                choices=("cuda", "cpu"),
                default=None,
                help="fail a worker whose Info says it serves on another device (default: any)",
            )
            sub.add_argument(
                "--golden",
                type=Path,
                default=None,
                metavar="PATH",
                help="JSON file, or directory of them, with token_ids and expected embeddings",
            )
    args = parser.parse_args(argv)
    if not (args.timeout > 0 and args.connect_timeout > 0):
        parser.error("--timeout and --connect-timeout must be positive")
    if getattr(args, "hot", 0) < 0:
        parser.error(f"--hot must be >= 0, not {args.hot}")
    if not 0 <= getattr(args, "min_cosine", 1.0) <= 1:  # as the operator's spec.rollout.minCosine
        parser.error(f"--min-cosine must be between 0 and 1, not {args.min_cosine}")
    try:
        token = (
            args.auth_token_file.read_text().strip()
            if args.auth_token_file is not None
            else os.environ.get("KEMBED_WORKER_AUTH_TOKEN", "").strip()
        )
    except OSError as error:
        parser.error(f"cannot read --auth-token-file: {error}")
    args.metadata = bearer(token)
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    run = {"stats": run_stats, "prewarm": run_prewarm, "smoke": run_smoke}[args.command]
    try:
        return run(args)
    except (OSError, ValueError, KeyError) as error:  # a golden file missing or malformed
        print(f"{args.command}: bad golden input: {error}", file=sys.stderr)
        return 2
    except Unreachable as error:
        print(f"{args.command}: {error}", file=sys.stderr)
        return 2
    except (grpc.RpcError, grpc.FutureTimeoutError) as error:
        details = error.details() if isinstance(error, grpc.RpcError) else "no answer in time"
        print(f"{args.command}: worker unreachable or failed: {details}", file=sys.stderr)
        return 2
