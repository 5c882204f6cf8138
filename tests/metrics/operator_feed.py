"""Operator metrics with real counts for Prometheus to scrape, without a cluster: the operator's own
`OperatorMetrics` served by its metrics server, fed by its real `reconcile` (a promoted rollout, then
a blocked one, each Job finishing with a duration) and its real kopf handler (reconciles timed and
counted by result, each model's phase: the blocked one, and another just created) against the
in-memory API of tests/operator/operator_fakes.py. A running operator
needs an API server (tests/operator_e2e does that, for minutes); what Prometheus sees is the same
exposition code.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import threading
from pathlib import Path
from types import ModuleType

import kopf

from kembed.operator.cluster.cluster import ClusterError
from kembed.operator.handlers import reconcile_handler
from kembed.operator.metrics import OperatorMetrics, serve_metrics
from kembed.operator.settings import OperatorSettings

FAKES = Path(__file__).resolve().parents[1] / "operator" / "operator_fakes.py"


def operator_fakes() -> ModuleType:
    """tests/operator/operator_fakes.py, imported by path: its folder is on sys.path only when the
    operator tests are collected too."""
    if "operator_fakes" in sys.modules:
        return sys.modules["operator_fakes"]
    spec = importlib.util.spec_from_file_location("operator_fakes", FAKES)
    module = importlib.util.module_from_spec(spec)
    sys.modules["operator_fakes"] = module
    spec.loader.exec_module(module)
    return module


class OperatorFeed:
    """The operator's metrics on a free port, and the traffic that moves them."""

    def __init__(self) -> None:
        self.metrics = OperatorMetrics()
        self.server, self.port = serve_metrics(self.metrics.registry, 0)
        self.fakes = operator_fakes()
        self.spec = self.fakes.example("minilm-cpu.yaml")["spec"]
        # A FakeCluster whose list calls meet API throttling (429): the handler counts a retry.
        self.throttled = type("ThrottledCluster", (self.fakes.FakeCluster,), {"list": _throttled_list})
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._blocked = None  # the Driver of the blocked model, once roll_out has blocked it

    def roll_out(self) -> None:
        """A rollout promoted, then an edit whose smoke test fails: blocked (Jobs of 3, 5 and 7 s)."""
        driver = self.fakes.Driver(self.spec, hooks=self.metrics.hooks())
        revision = driver.step()["candidateRevision"]
        driver.cluster.run_workers(revision)
        driver.step()
        driver.cluster.finish_job("prewarm", True, seconds=3)
        driver.step()
        driver.cluster.finish_job("smoke", True, seconds=5)
        driver.step()
        driver.cluster.roll_gateway()
        driver.step()
        driver.edit("model", dtype="float16")
        new = driver.step()["candidateRevision"]
        driver.cluster.run_workers(new, ip_base=20)
        driver.step()
        driver.cluster.finish_job("prewarm", True, seconds=3)
        driver.step()
        driver.cluster.finish_job("smoke", False, report="FAILED", seconds=7)
        assert driver.step()["phase"] == "Blocked"
        self.reconcile(driver.cluster, driver.body)  # the handler records its phase: Blocked
        self._blocked = driver

    def reconcile(self, cluster=None, body=None) -> None:
        """One pass of the real kopf handler, counted and timed by result; by default of a model just
        created (`minilm-next`, Progressing) on an empty cluster."""
        memo = kopf.Memo(
            cluster=cluster or self.fakes.FakeCluster(),
            images=self.fakes.IMAGES,
            locks={},
            settings=OperatorSettings(),
            metrics=self.metrics,
        )
        body = body or self.fakes.model_body(self.spec, name="minilm-next")
        with contextlib.suppress(kopf.TemporaryError):  # a throttled API: counted as a retry
            reconcile_handler(body=body, memo=memo, patch=kopf.Patch())

    def start_reconciling(self, every_s: float = 0.5) -> None:
        """Reconcile on a timer, as kopf's drift timer does: the new model (every tenth pass meets a
        throttled API) and, once there is one, the blocked model (still Blocked)."""

        def loop() -> None:
            count = 0
            while not self._stop.wait(every_s):
                count += 1
                self.reconcile(self.throttled() if count % 10 == 0 else None)
                blocked = self._blocked
                if blocked is not None:
                    self.reconcile(blocked.cluster, blocked.body)

        self._thread = threading.Thread(target=loop, name="operator-feed", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        self.server.shutdown()
        self.server.server_close()


def _throttled_list(self, kind, namespace, labels):
    raise ClusterError(429, "slow down")
