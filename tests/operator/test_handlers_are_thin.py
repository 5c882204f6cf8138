"""The kopf handler only wires `reconcile` to kopf: status into the patch, a bad spec into
PermanentError plus an Invalid status, a transient API failure into TemporaryError."""

from __future__ import annotations

import kopf
import pytest
from operator_fakes import FakeCluster, example, model_body

from kembed.operator.cluster.cluster import ClusterError
from kembed.operator.cluster.reconcile import Images
from kembed.operator.handlers import reconcile_handler, register
from kembed.operator.metrics import OperatorMetrics
from kembed.operator.settings import OperatorSettings


def memo(cluster) -> kopf.Memo:
    return kopf.Memo(
        cluster=cluster,
        images=Images("w:1", "g:1"),
        locks={},
        settings=OperatorSettings(retry_delay_s=7),
        metrics=OperatorMetrics(),
    )


def test_status_goes_into_the_patch():
    patch = kopf.Patch()
    reconcile_handler(
        body=model_body(example("minilm-cpu.yaml")["spec"]), memo=memo(FakeCluster()), patch=patch
    )
    assert patch["status"]["phase"] == "Progressing" and patch["status"]["candidateRevision"]


def test_a_bad_spec_is_permanent_and_reported_in_status():
    patch = kopf.Patch()
    body = model_body({"model": {"source": {"hostPath": {"path": "/m"}}}, "worker": {"replicas": -1}})
    with pytest.raises(kopf.PermanentError):
        reconcile_handler(body=body, memo=memo(FakeCluster()), patch=patch)
    ready = next(c for c in patch["status"]["conditions"] if c["type"] == "Ready")
    assert patch["status"]["phase"] == "Invalid" and ready["reason"] == "InvalidSpec"


class Throttled(FakeCluster):
    def list(self, kind, namespace, labels):
        raise ClusterError(429, "slow down")


def test_a_transient_api_failure_is_retried_after_the_configured_delay():
    with pytest.raises(kopf.TemporaryError) as raised:
        reconcile_handler(
            body=model_body(example("minilm-cpu.yaml")["spec"]), memo=memo(Throttled()), patch=kopf.Patch()
        )
    assert raised.value.delay == 7


def test_handlers_register_without_a_cluster():
    registry = kopf.OperatorRegistry()
    register(registry, OperatorSettings(reconcile_interval_s=3))
    ids = {h.id for h in registry._spawning.get_all_handlers()} | {
        h.id for h in registry._changing.get_all_handlers()
    }
    assert {"reconcile", "drift"} <= ids
