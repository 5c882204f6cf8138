"""`kembed-worker` (`python -m kembed.worker`): parse flags and environment once into a WorkerConfig
(cli.py), then serve; or run one of the client tools against running workers (`cli.COMMANDS`).
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import logging
import signal
import socket
import sys
from typing import TYPE_CHECKING, Protocol

from kembed.worker.buckets import Bucket
from kembed.worker.cli import COMMANDS, parse_config, program_name
from kembed.worker.config import WorkerConfig
from kembed.worker.errors import InvalidInput, StartupError

if TYPE_CHECKING:  # imported in `serve`, so that `--help` and config errors answer at once
    from collections.abc import Sequence

    from kembed.worker.info import EngineStats
    from kembed.worker.scheduler import BatchRunner
    from kembed.worker.server import EngineOps

    class ServedEngine(EngineOps, BatchRunner, Protocol):
        """What `serve` asks of an engine: the loaded model's (`BaseEngine`), or a benchmark's stand-in."""

        @property
        def lane(self) -> BatchRunner | None:
            """An engine for interactive batches beside this one's, or None."""

        def stats(self) -> EngineStats: ...

        def prewarm_at_start(
            self, prewarm: str | Sequence[Bucket], hot: Sequence[Bucket], max_seconds: float
        ) -> object: ...


log = logging.getLogger("kembed.worker")

__all__ = ["main", "parse_config", "run", "serve"]


async def serve(config: WorkerConfig, engine: ServedEngine | None = None) -> None:
    """Serve until SIGINT/SIGTERM. `engine` defaults to the configured model's (`load_engine`); a
    benchmark passes a stand-in to measure the request path alone (tests/bench/standin_worker.py)."""
    # Imported here so `--help` and config errors answer without loading torch.
    from kembed.worker.frames import FrameService, serve_frames
    from kembed.worker.metrics import WorkerMetrics, serve_metrics
    from kembed.worker.scheduler import Scheduler
    from kembed.worker.server import MAX_MESSAGE_BYTES, EmbedderService, build_server

    # The gRPC and data ports are bound only once the model is loaded and prewarmed (minutes on a
    # GPU): a port another process holds is found now, not then.
    _check_free(config.host, config.port, "gRPC (--port)")
    _check_free(config.host, config.data_port, "the data port (--data-port)")
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
        lane=engine.lane,
        lane_max_batch_tokens=config.lane_max_batch_tokens,
        lane_max_batch_sequences=config.lane_max_batch_sequences,
        lane_inflight_batches=config.lane_inflight_batches,
    )
    metrics.watch(engine.stats, scheduler, config.max_pinned_bytes)
    metrics_server = None
    if config.metrics_port:  # up during prewarm: its captures show as they happen
        try:
            metrics_server, metrics_port = serve_metrics(metrics.registry, config.host, config.metrics_port)
        except OSError as error:
            raise _cannot_listen(
                config.host, config.metrics_port, "metrics (--metrics-port)", error
            ) from None
        log.info("worker metrics on http://%s:%d/metrics", config.host, metrics_port)
    # On the launcher thread, where steps and idle-time captures run, and before the gRPC port is
    # bound: no request (and no TCP probe) reaches a worker that is still capturing.
    await scheduler.run_on_device(
        engine.prewarm_at_start, config.prewarm, hot_first(config), config.prewarm_seconds
    )
    service = EmbedderService(engine, scheduler, config.max_batch_tokens, config.revision)
    server, port = build_server(service, config.host, config.port, config.auth_token, config.auth_data)
    frames = None
    frame_server = FrameService(scheduler, engine.info)
    if config.data_port >= 0:  # before gRPC serves: the gateway's first Info must advertise it
        try:
            frames, data_port = await serve_frames(
                frame_server,
                config.host,
                config.data_port,
                MAX_MESSAGE_BYTES,
                config.auth_token if config.auth_data else "",
                config.data_idle_timeout_s,
            )
        except OSError as error:
            raise _cannot_listen(
                config.host, config.data_port, "the data port (--data-port)", error
            ) from None
        service.advertise_data_port(data_port, config.data_idle_timeout_s)
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
    await asyncio.gather(service.drain(timeout_s=10), frame_server.drain(timeout_s=10))
    await server.stop(grace=10)  # refuses new RPCs, lets running ones finish
    await scheduler.close()
    if metrics_server is not None:
        metrics_server.shutdown()


def hot_first(config: WorkerConfig) -> tuple[Bucket, ...]:
    """The buckets a start-up prewarm captures first: the listed hot ones, then those the operator
    observed the serving workers hit most (logged, with where they came from)."""
    observed = config.prewarm_observed
    if observed and config.prewarm == "none":
        log.info("prewarm: none at start; the %d observed hot buckets are not captured", len(observed))
    elif observed:
        log.info(
            "prewarming %d hot buckets from the operator's hot list (KEMBED_WORKER_PREWARM_OBSERVED) "
            "first: %s",
            len(observed),
            ", ".join(map(str, observed)),
        )
    return tuple(dict.fromkeys([*config.prewarm_hot, *observed]))


def _check_free(host: str, port: int, what: str) -> None:
    """Raise StartupError if `port` (> 0) cannot be bound on `host` now (a listener holds it)."""
    if port <= 0:
        return
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except OSError:
        return  # the real bind will say what is wrong with the host
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers: TIME_WAIT is fine
        try:
            probe.bind(address)
        except OSError as error:
            raise _cannot_listen(host, port, what, error) from None


def _cannot_listen(host: str, port: int, what: str, error: OSError) -> StartupError:
    return StartupError(f"cannot listen on {host}:{port} for {what}: {error.strerror or error}")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in COMMANDS:  # a client tool against running workers
        module, _ = COMMANDS[argv[0]]
        sys.exit(importlib.import_module(module).main(argv))
    config = parse_config(argv)
    logging.basicConfig(level=config.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        run(config)
    except (StartupError, InvalidInput) as exc:  # a configuration this machine cannot serve
        print(f"{program_name()}: error: {exc}", file=sys.stderr)
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
