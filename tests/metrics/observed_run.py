"""The observed run the metrics tests share: two CPU workers on the bundled model (revisions
rev-a and rev-b, as in the middle of a rollout; rev-b with a small queue so that the gateway retries
chunks it refuses) behind one gateway, a second gateway of the same model whose one worker address
answers nothing (an outage: every request 503, no serving worker), the operator's metrics fed by its
real reconcile, a real Prometheus scraping all five every second, and a short phased load. Each
series carries the `namespace` and `pod` a PodMonitor/ServiceMonitor scrape would give it.
"""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from operator_feed import OperatorFeed
from prom_server import Prometheus, Target

NAMESPACE = "kembed-test"  # the model's namespace; the operator runs in its own
OPERATOR_NAMESPACE = "kembed-system"
MODEL = "sentence-transformers/all-MiniLM-L6-v2"  # what the workers serve
GATEWAY_POD, LOST_GATEWAY_POD = "minilm-gateway-0", "minilm-gateway-1"
IDLE_AFTER_S = 5  # after the load: gauges back to idle, and scraped so


def e2e_processes() -> ModuleType:
    """tests/e2e/processes.py (spawning and readiness of real processes), imported by path: its
    folder is on sys.path only when the e2e tests are collected too."""
    if "processes" in sys.modules:
        return sys.modules["processes"]
    path = Path(__file__).resolve().parents[1] / "e2e" / "processes.py"
    spec = importlib.util.spec_from_file_location("processes", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["processes"] = module
    spec.loader.exec_module(module)
    return module


@dataclass
class ObservedRun:
    prometheus: Prometheus
    targets: list[Target]
    load_start: float  # unix seconds
    load_end: float
    end: float
    statuses: Counter  # (path, HTTP status) -> count of the load's requests
    lost_statuses: Counter  # the same, of the requests sent to the gateway without a worker


@dataclass(frozen=True)
class Services:
    targets: list[Target]
    url: str  # the gateway in front of the two workers
    lost_url: str  # the gateway whose worker never answers


def start_services(log_dir: Path, feed: OperatorFeed, processes: list) -> Services:
    """Two workers and a gateway, ready, and the gateway without a worker, up; appended to `processes`
    as they start, for the teardown."""
    p = e2e_processes()
    targets, addresses = [], []
    for revision, extra in (
        ("rev-a", []),
        ("rev-b", ["--max-batch-tokens", "512", "--max-queued-tokens", "768"]),
    ):
        port, metrics_port = p.free_port(), p.free_port()
        args = ["kembed.worker", "--device", "cpu", "--num-threads", "1", "--revision", revision]
        args += ["--port", str(port), "--metrics-port", str(metrics_port), *extra]
        processes.append(p.spawn(f"worker-{revision}", args, log_dir))
        addresses.append(f"127.0.0.1:{port}")
        targets.append(
            Target("worker", f"127.0.0.1:{metrics_port}", NAMESPACE, f"minilm-worker-{revision}-0")
        )
    port = p.free_port()
    # 256-token chunks: a request of up to 16 texts spans several, so the small queue fills (the
    # gateway sends every chunk at once, so rev-b's queue refuses some).
    # A 1 ms hedge budget, not stretched by the work ahead (multiple 0): chunks are hedged (the
    # throttle's first 10 and its 2 % after), so the hedges panel moves.
    args = ["kembed.gateway", "--port", str(port), "--chunk-tokens", "256"]
    args += ["--hedge-after-s", "0.001", "--hedge-multiple", "0"]
    for address in addresses:
        args += ["--worker", address]
    processes.append(p.spawn("gateway", args, log_dir))
    targets.append(Target("gateway", f"127.0.0.1:{port}", NAMESPACE, GATEWAY_POD))
    # The model's second gateway pod, cut off from its workers: a port nothing listens on. It names
    # the model itself (without a worker's Info it would name the model directory).
    lost_port = p.free_port()
    args = ["kembed.gateway", "--port", str(lost_port), "--worker", f"127.0.0.1:{p.free_port()}"]
    processes.append(p.spawn("gateway-lost", [*args, "--served-model-name", MODEL], log_dir))
    targets.append(Target("gateway", f"127.0.0.1:{lost_port}", NAMESPACE, LOST_GATEWAY_POD))
    targets.append(Target("operator", f"127.0.0.1:{feed.port}", OPERATOR_NAMESPACE, "kembed-operator-0"))
    url, lost_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{lost_port}"
    p.wait_ready(url, processes)
    p.wait_all_serving(url)
    p.wait_ready(lost_url, processes, path="/health")  # its /ready stays 503: no worker
    return Services(targets, url, lost_url)
