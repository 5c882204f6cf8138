"""Serving the gateway from one process, or from several on one port.

A gateway process does its CPU work (HTTP, JSON, tokenization, gRPC) on one event loop, so one process
uses one core. With `processes` > 1 each child process is a whole gateway (its own loop, tokenizers and
worker channels) on its own SO_REUSEPORT socket: the kernel spreads connections over them. Their
metrics are summed at each scrape through prometheus_client's multiprocess mode (a directory of
per-process files, created here and removed at exit). If one child dies, the others are stopped and
the parent exits non-zero, so that the pod restarts whole rather than serving on fewer cores.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import socket
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kembed.gateway.config import GatewayConfig

if TYPE_CHECKING:  # workers.py loads gRPC and numpy: imported where serving starts, not with the config
    from kembed.gateway.pool.replicas import Resolve
    from kembed.proto.model_identity import ModelIdentity

log = logging.getLogger(__name__)
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
BACKLOG = 2048  # uvicorn's default


def serve(config: GatewayConfig, resolve: Resolve | None = None) -> None:
    """Serve until SIGINT/SIGTERM: here if `config.processes` is 1, else in that many children.
    `resolve`: how worker_service's name is resolved; None: DNS (replicas.resolve_dns). Another must
    be picklable when `config.processes` > 1 (each child is spawned with it)."""
    from kembed.gateway.endpoint import is_multi_model
    from kembed.gateway.pool.model_check import read_own_identity

    # once, not in every process (a model's weights); several models are read in their one process
    identity = None if is_multi_model(config) else read_own_identity(config.model_dir)
    if config.processes == 1:
        serve_one(config, resolve=resolve, identity=identity)
        return
    metrics_dir = Path(tempfile.mkdtemp(prefix="kembed-gateway-metrics-"))
    # Read by prometheus_client when a child imports it, which is why it is set before they start.
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    context = multiprocessing.get_context("spawn")
    children = [
        context.Process(
            target=serve_one, args=(config, metrics_dir, resolve, identity), name=f"kembed-gateway-{i}"
        )
        for i in range(config.processes)
    ]
    is_signalled = False

    def stop() -> None:
        for child in children:
            if child.is_alive():
                child.terminate()  # SIGTERM: uvicorn finishes the requests in flight

    def on_signal(signum: int, frame: object) -> None:
        nonlocal is_signalled
        is_signalled = True
        stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        for child in children:
            child.start()
        log.info("gateway serving %s:%d from %d processes", config.host, config.port, config.processes)
        ended = multiprocessing.connection.wait([child.sentinel for child in children])
        if not is_signalled:
            dead = next(child for child in children if child.sentinel in ended)
            dead.join()  # its sentinel closes as it exits: join for its exit code
            log.error("gateway process %s exited with %s; stopping the others", dead.pid, dead.exitcode)
            stop()
        for child in children:
            child.join()
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)
    if not is_signalled:
        sys.exit(1)


def serve_one(
    config: GatewayConfig,
    metrics_dir: Path | None = None,
    resolve: Resolve | None = None,
    identity: ModelIdentity | None = None,
) -> None:
    """One gateway on uvicorn (uvloop, httptools). A child of `serve` (given `metrics_dir`) binds its
    own SO_REUSEPORT socket; a lone gateway lets uvicorn bind. `identity`: the model's digests as
    `serve` read them (None: read here)."""
    import uvicorn  # only needed to serve; keeps the config importable cheaply in tests

    from kembed.gateway.edge.app import create_app
    from kembed.gateway.pool.replicas import resolve_dns

    if metrics_dir is not None:  # a spawned child starts without the parent's logging setup
        logging.basicConfig(level=config.log_level.upper(), format=LOG_FORMAT)
    app = create_app(config, metrics_dir=metrics_dir, resolve=resolve or resolve_dns, identity=identity)
    server = uvicorn.Server(uvicorn_config(config, app))
    freeze_startup_objects()
    # uvicorn drains on SIGTERM/SIGINT, then restores the handlers it found and raises the signal
    # again; with the default handler the process would die of it (exit -15) after a clean drain.
    # These handlers take that second delivery, so a drained gateway exits 0.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: None)
    server.run(sockets=None if metrics_dir is None else [_reuseport_socket(config.host, config.port)])


def uvicorn_config(config: GatewayConfig, app: Any, **overrides: Any) -> Any:
    """uvicorn's Config for `app` (from create_app): uvloop, and httptools behind the connection
    bounds of connections.py; `overrides` for tests (e.g. loop="asyncio", port)."""
    import uvicorn

    from kembed.gateway.edge.connections import connection_cap, guarded_protocol, raise_fd_limit

    cap = connection_cap(config, raise_fd_limit())
    options: dict[str, Any] = {
        "host": config.host,
        "port": config.port,
        "loop": "uvloop",
        "http": guarded_protocol(config, app.state.metrics, cap, app.state.hot_path),
        "timeout_keep_alive": config.keep_alive_timeout_s,
        "access_log": False,
        "log_level": config.log_level,
        "lifespan": "on",
        "ws": "none",  # no WebSocket routes: an Upgrade request is served as plain HTTP
        "backlog": BACKLOG,
    }
    return uvicorn.Config(app, **(options | overrides))


def freeze_startup_objects() -> None:
    """Exempt what exists after start (modules, tokenizer settings, the app) from garbage collection.
    A full collection otherwise walks all of it and stops the event loop for ~15-20 ms, every request
    in flight waiting (the p99 of a busy gateway); afterwards it walks only objects made since."""
    gc.collect()
    gc.freeze()


def _reuseport_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(BACKLOG)
    return sock
