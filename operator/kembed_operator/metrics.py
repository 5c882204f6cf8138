"""The operator's Prometheus metrics: reconciles, rollout gate outcomes, prewarm and smoke Job durations,
each model's phase.

Names and labels are a contract with the dashboards and alerts (docs/metrics.md); every label set is
bounded (the phase gauge: six series per EmbeddingModel, gone with it). `reconcile` reports through
plain `ReconcileHooks` (it imports no prometheus); the handler times and counts the reconciles and
records the phase of the status it writes. A registry of its own per operator, served on
`metrics_port`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import get_args
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from kembed.operator.cluster.reconcile import ReconcileHooks
from kembed.operator.spec.status import Phase

# A reconcile is a handful of API calls: milliseconds to tens of seconds (API timeouts).
RECONCILE_BUCKETS = tuple(1e-3 * 2**i for i in range(16))
# A prewarm or smoke Job runs seconds (a few buckets on a warm node) to its timeout (minutes).
JOB_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0)
RECONCILE_RESULTS = ("ok", "invalid", "retry", "error")
JOB_KINDS = ("prewarm", "smoke")
JOB_RESULTS = ("succeeded", "failed")
PHASES: tuple[str, ...] = get_args(Phase)


class OperatorMetrics:
    """Every operator metric, registered on `registry` (a fresh one by default)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = CollectorRegistry() if registry is None else registry
        r = self.registry
        self.reconciles = Counter(
            "kembed_operator_reconciles",
            "Reconciles of an EmbeddingModel, by result: ok, invalid (bad spec), retry (transient API "
            "error), error (anything else).",
            ["result"],
            registry=r,
        )
        self.reconcile_duration = Histogram(
            "kembed_operator_reconcile_duration_seconds",
            "Time of one reconcile (read the world, decide, apply).",
            buckets=RECONCILE_BUCKETS,
            registry=r,
        )
        self.rollouts = Counter(
            "kembed_operator_rollouts",
            "Rollouts that ended at the gate: promoted (prewarm and smoke test passed) or blocked.",
            ["result"],
            registry=r,
        )
        self.job_duration = Histogram(
            "kembed_operator_job_duration_seconds",
            "Run time of a finished prewarm or smoke-test Job (start to completion or failure).",
            ["kind", "result"],
            buckets=JOB_BUCKETS,
            registry=r,
        )
        self.model_fetch_failures = Counter(
            "kembed_operator_model_fetch_failures",
            "Fetches of a huggingFace or s3 source that failed (a resolve Job, a cache Job, a pod's fetch "
            "init container), by source and reason (forbidden, not_found, checksum, disk_full, refused, "
            "unverified, changed, network, deadline, other); each failed Job or container run once.",
            ["source", "reason"],
            registry=r,
        )
        for result in RECONCILE_RESULTS:  # every series present from the start, at 0
            self.reconciles.labels(result)
        for result in ("promoted", "blocked"):
            self.rollouts.labels(result)
        for kind in JOB_KINDS:  # so that increase() sees a Job's first observation
            for result in JOB_RESULTS:
                self.job_duration.labels(kind, result)
        self._seen_jobs: set[str] = set()
        self._seen_fetch_failures: set[str] = set()
        self._lock = threading.Lock()  # kopf runs sync handlers on a thread pool
        self.phases = ModelPhases()
        r.register(self.phases)

    def _job_ended(self, uid: str, kind: str, result: str, seconds: float) -> None:
        # Every reconcile sees a finished Job again until it is retired: observe each Job once.
        with self._lock:
            if uid in self._seen_jobs:
                return
            self._seen_jobs.add(uid)
        self.job_duration.labels(kind, result).observe(seconds)

    def _model_fetch_failed(self, uid: str, source: str, reason: str) -> None:
        with self._lock:  # every reconcile sees a failed Job or container again: count each once
            if uid in self._seen_fetch_failures:
                return
            self._seen_fetch_failures.add(uid)
        self.model_fetch_failures.labels(source, reason).inc()

    def hooks(self) -> ReconcileHooks:
        """`reconcile`'s callbacks, bound to these metrics."""
        return ReconcileHooks(
            rollout_ended=lambda result: self.rollouts.labels(result).inc(),
            job_ended=self._job_ended,
            model_fetch_failed=self._model_fetch_failed,
        )


class ModelPhases(Collector):
    """`kembed_operator_model_phase{model_namespace, model, phase}`: 1 for each EmbeddingModel's phase
    (the status the operator last wrote for it), 0 for the other phases, read when Prometheus scrapes.

    The model's namespace is `model_namespace`, not `namespace`: a ServiceMonitor or PodMonitor
    scrape sets `namespace` to the operator pod's, and would rename ours `exported_namespace`."""

    def __init__(self) -> None:
        self._phases: dict[tuple[str, str], str] = {}  # (namespace, name) -> phase
        self._lock = threading.Lock()

    def set(self, namespace: str, name: str, phase: str) -> None:
        assert phase in PHASES, phase
        with self._lock:
            self._phases[namespace, name] = phase

    def forget(self, namespace: str, name: str) -> None:
        """A deleted model: its series go."""
        with self._lock:
            self._phases.pop((namespace, name), None)

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "kembed_operator_model_phase", "", labels=["model_namespace", "model", "phase"]
        )

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "kembed_operator_model_phase",
            "Phase of each EmbeddingModel (its status.phase): 1 for the current one, 0 for the others.",
            labels=["model_namespace", "model", "phase"],
        )
        with self._lock:
            phases = sorted(self._phases.items())
        for (namespace, name), current in phases:
            for phase in PHASES:
                family.add_metric([namespace, name, phase], 1.0 if phase == current else 0.0)
        yield family


def serve_metrics(registry: CollectorRegistry, port: int) -> tuple[WSGIServer, int]:
    """prometheus_client's HTTP server for `registry` on all addresses, on a daemon thread."""
    server, _ = start_http_server(port, addr="0.0.0.0", registry=registry)
    return server, server.server_port
