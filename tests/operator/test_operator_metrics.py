"""The operator's metrics: contracted names, rollout gate outcomes and Job durations counted once
each, reconciles counted by result; served over HTTP on the metrics port."""

from __future__ import annotations

import urllib.request

import kopf
import pytest
from operator_fakes import Driver, FakeCluster, example, model_body
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kembed.operator.cluster import ClusterError
from kembed.operator.handlers import reconcile_handler
from kembed.operator.metrics import OperatorMetrics, serve_metrics
from kembed.operator.reconcile import Images
from kembed.operator.settings import OperatorSettings

CONTRACT = {  # family name -> label names of its samples (histogram `le` aside)
    "kembed_operator_reconciles": {"result"},
    "kembed_operator_reconcile_duration_seconds": set(),
    "kembed_operator_rollouts": {"result"},
    "kembed_operator_job_duration_seconds": {"kind", "result"},
}


def samples(metrics: OperatorMetrics) -> dict[str, float]:
    """Every sample as `name{label="value",...}` -> value, labels sorted."""
    out = {}
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}"] = sample.value
    return out


def driven(metrics: OperatorMetrics) -> Driver:
    return Driver(example("minilm-cpu.yaml")["spec"], hooks=metrics.hooks())


def test_a_promotion_counts_once_with_each_jobs_duration():
    metrics = OperatorMetrics()
    driver = driven(metrics)
    driver.promote()
    for _ in range(3):  # steady passes change nothing
        driver.step()
    after = samples(metrics)
    assert after['kembed_operator_rollouts_total{result="promoted"}'] == 1
    assert after['kembed_operator_rollouts_total{result="blocked"}'] == 0
    for kind in ("prewarm", "smoke"):
        labels = f'kind="{kind}",result="succeeded"'
        assert after[f"kembed_operator_job_duration_seconds_count{{{labels}}}"] == 1
        assert after[f"kembed_operator_job_duration_seconds_sum{{{labels}}}"] == 42


def test_a_blocked_rollout_counts_once_while_it_stays_blocked():
    metrics = OperatorMetrics()
    driver = driven(metrics)
    driver.promote()
    driver.edit("model", dtype="float16")
    new = driver.step()["candidateRevision"]
    driver.cluster.run_workers(new, ip_base=20)
    driver.step()
    driver.cluster.finish_job("prewarm", True, seconds=3)
    driver.step()
    driver.cluster.finish_job("smoke", False, report="FAILED", seconds=7)
    for _ in range(3):  # the failed Job is kept for its logs and seen on every pass
        assert driver.step()["phase"] == "Blocked"
    after = samples(metrics)
    assert after['kembed_operator_rollouts_total{result="promoted"}'] == 1
    assert after['kembed_operator_rollouts_total{result="blocked"}'] == 1
    assert after['kembed_operator_job_duration_seconds_count{kind="smoke",result="failed"}'] == 1
    assert after['kembed_operator_job_duration_seconds_sum{kind="smoke",result="failed"}'] == 7


class Throttled(FakeCluster):
    def list(self, kind, namespace, labels):
        raise ClusterError(429, "slow down")


def test_the_handler_counts_reconciles_by_result_with_the_contracted_names():
    metrics = OperatorMetrics()

    def handle(cluster, spec):
        memo = kopf.Memo(
            cluster=cluster,
            images=Images("w:1", "g:1"),
            locks={},
            settings=OperatorSettings(),
            metrics=metrics,
        )
        reconcile_handler(body=model_body(spec), memo=memo, patch=kopf.Patch())

    good = example("minilm-cpu.yaml")["spec"]
    handle(FakeCluster(), good)
    with pytest.raises(kopf.TemporaryError):
        handle(Throttled(), good)
    with pytest.raises(kopf.PermanentError):
        handle(FakeCluster(), {"model": {"source": {"hostPath": {"path": "/m"}}}, "worker": {"replicas": -1}})
    text = generate_latest(metrics.registry).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name, labels in CONTRACT.items():
        assert name in families, name
        for sample in families[name].samples:
            assert set(sample.labels) - {"le"} == labels, sample
    after = samples(metrics)
    for result, count in (("ok", 1), ("retry", 1), ("invalid", 1), ("error", 0)):
        assert after[f'kembed_operator_reconciles_total{{result="{result}"}}'] == count, result
    assert after["kembed_operator_reconcile_duration_seconds_count{}"] == 3


def test_metrics_are_served_over_http():
    metrics = OperatorMetrics()
    server, port = serve_metrics(metrics.registry, 0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    assert "kembed_operator_rollouts_total" in text
