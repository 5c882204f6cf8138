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
import time
from typing import TYPE_CHECKING, Protocol

from kembed.proto.accuracy import MIN_COSINE
from kembed.worker.buckets import Bucket
from kembed.worker.cli import COMMANDS, parse_config, program_name
from kembed.worker.config import WorkerConfig
from kembed.worker.errors import InvalidInput, StartupError

if TYPE_CHECKING:  # imported in `serve`, so that `--help` and config errors answer at once
    from collections.abc import Sequence

    from kembed.worker.edge.server import EngineOps
    from kembed.worker.info import EngineStats
    from kembed.worker.scheduling.scheduler import BatchRunner

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
    from kembed.worker.edge.frames import FrameService, serve_frames
    from kembed.worker.edge.server import MAX_MESSAGE_BYTES, EmbedderService, build_server
    from kembed.worker.metrics import WorkerMetrics, serve_metrics
    from kembed.worker.scheduling.scheduler import Scheduler
    from kembed.worker.scheduling.stalls import LoopWatch, StepWatch

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
        steps=StepWatch(
            config.stall_multiple,
            config.stall_min_s,
            config.stall_unseen_s,
            min_batch_tokens=config.max_batch_tokens // 4,
            # a gap between the watch's looks past twice its period: the process was not running
            max_gap_s=2 * STALL_CHECK_S,
            # a CPU step is seen to progress by the CPU the process spends (stalls.py)
            progress=time.process_time if engine.info.device == "cpu" else None,
        ),
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
    if config.self_check_buckets:  # graphs replayed against eager runs before the port opens
        await scheduler.run_on_device(self_check, engine, config.self_check_buckets)
    rate = await scheduler.run_on_device(measure_rate, engine, config.max_batch_tokens)
    if rate > 0:
        scheduler.steps.measured(rate)
        log.info(
            "device rate at start: %.0f tokens/s (a batch of %d tokens)",
            rate,
            _rate_tokens(config.max_batch_tokens),
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
    loop_watch = LoopWatch()
    loop_watch.start()
    stall_watch = asyncio.create_task(
        service.readiness.watch(scheduler.steps.stall, STALL_CHECK_S, loop_watch.beat),
        name="kembed-stall-watch",
    )
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
    stall_watch.cancel()
    loop_watch.stop()
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


STALL_CHECK_S = 0.2  # how often the worker asks whether a device step has stalled


def self_check(engine: EngineOps, num_buckets: int) -> None:
    """Before this worker serves, `num_buckets` of its captured buckets (the smallest, the largest and
    some between) replayed against eager runs on fixed inputs, as the rollout's smoke test does: a pod
    added after the rollout (a scale-up, a restart, another node's GPU or driver) gates itself.
    StartupError on a mismatch; nothing to check without captured graphs (a CPU worker)."""
    captured = sorted(engine.captured_buckets())
    if not captured:
        return
    picks = sorted(
        {captured[round(i * (len(captured) - 1) / max(1, num_buckets - 1))] for i in range(num_buckets)}
    )
    results = engine.smoke_test(picks, MIN_COSINE, 0)
    failed = [r for r in results if not r.passed]
    summary = ", ".join(f"{r.bucket} {r.min_cosine:.5f}" for r in results)
    if failed:
        raise StartupError(
            f"self-check failed: graph replay does not match eager runs (min cosine per bucket: {summary}; "
            f"at least {MIN_COSINE} wanted, and no NaN/Inf)"
        )
    log.info("self-check passed: %d captured buckets replayed against eager runs (%s)", len(results), summary)


def _rate_tokens(max_batch_tokens: int) -> int:
    return max(1, min(max_batch_tokens, 512) // 128) * 128


def measure_rate(engine: BatchRunner, max_batch_tokens: int) -> float:
    """Tokens per second of a start-up batch of up to 512 tokens in sequences of 128 (the better of
    two steps: the first may capture or warm up), 0 if it fails; on the launcher thread. What the
    gateway weighs a request's work against until full batches have been measured (stalls.py)."""
    import time

    import numpy as np

    num_tokens = _rate_tokens(max_batch_tokens)
    lengths = np.full(num_tokens // 128, 128, dtype=np.int64)
    token_ids = np.full(num_tokens, 100, dtype=np.int32)
    best = float("inf")
    try:
        for _ in range(2):
            started = time.perf_counter()
            engine.step(engine.pack(token_ids, lengths)).wait()
            best = min(best, time.perf_counter() - started)
    except Exception as error:  # a stand-in without a step of that shape; the rate is measured later
        log.warning("no start-up rate measured: %s", error)
        return 0.0
    return num_tokens / best


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
