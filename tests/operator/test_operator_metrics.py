"""The operator's metrics: contracted names, rollout gate outcomes and Job durations counted once
each, reconciles counted by result, each model's phase as the handler writes it (gone with the
model); served over HTTP on the metrics port."""

from __future__ import annotations

import urllib.request

import kopf
import pytest
from operator_fakes import IMAGES, Driver, FakeCluster, example, model_body
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kembed.operator.cluster.cluster import ClusterError
from kembed.operator.handlers import deleted_handler, reconcile_handler
from kembed.operator.metrics import PHASES, OperatorMetrics, serve_metrics
from kembed.operator.settings import OperatorSettings

CONTRACT = {  # family name -> label names of its samples (histogram `le` aside)
    "kembed_operator_reconciles": {"result"},
    "kembed_operator_reconcile_duration_seconds": set(),
    "kembed_operator_rollouts": {"result"},
    "kembed_operator_job_duration_seconds": {"kind", "result"},
    "kembed_operator_model_phase": {"model_namespace", "model", "phase"},
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


def block_a_rollout(driver, prewarm_s: float = 42, smoke_s: float = 42) -> None:
    """Promote the first revision, then roll out a second whose smoke test fails."""
    driver.promote()
    driver.edit("model", dtype="float16")
    new = driver.step()["candidateRevision"]
    driver.cluster.run_workers(new, ip_base=20)
    driver.step()
    driver.cluster.finish_job("prewarm", True, seconds=prewarm_s)
    driver.step()
    driver.cluster.finish_job("smoke", False, report="FAILED", seconds=smoke_s)


def test_a_blocked_rollout_counts_once_while_it_stays_blocked():
    metrics = OperatorMetrics()
    driver = driven(metrics)
    block_a_rollout(driver, prewarm_s=3, smoke_s=7)
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


def memo_of(metrics: OperatorMetrics, cluster: FakeCluster) -> kopf.Memo:
    return kopf.Memo(cluster=cluster, images=IMAGES, locks={}, settings=OperatorSettings(), metrics=metrics)


def phases(metrics: OperatorMetrics) -> dict[tuple[str, str], dict[str, float]]:
    """(namespace, model) -> phase -> value of kembed_operator_model_phase."""
    out: dict[tuple[str, str], dict[str, float]] = {}
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for sample in family.samples:
            if sample.name == "kembed_operator_model_phase":
                key = (sample.labels["model_namespace"], sample.labels["model"])
                out.setdefault(key, {})[sample.labels["phase"]] = sample.value
    return out


def only(phase: str) -> dict[str, float]:
    return {p: 1.0 if p == phase else 0.0 for p in PHASES}


def test_the_handler_records_each_models_phase_from_the_status_it_writes():
    metrics = OperatorMetrics()
    assert phases(metrics) == {}  # no model reconciled yet: no series
    patch = kopf.Patch()
    reconcile_handler(
        body=model_body(example("minilm-cpu.yaml")["spec"]), memo=memo_of(metrics, FakeCluster()), patch=patch
    )
    assert patch["status"]["phase"] == "Progressing"
    assert phases(metrics) == {("ml", "minilm"): only("Progressing")}
    bad = model_body(
        {"model": {"source": {"hostPath": {"path": "/m"}}}, "worker": {"replicas": -1}}, name="bad"
    )
    with pytest.raises(kopf.PermanentError):
        reconcile_handler(body=bad, memo=memo_of(metrics, FakeCluster()), patch=kopf.Patch())
    assert phases(metrics) == {("ml", "minilm"): only("Progressing"), ("ml", "bad"): only("Invalid")}


def test_a_blocked_model_reads_blocked_on_every_pass_until_its_spec_moves_on():
    """What KembedRolloutBlocked reads: Blocked for as long as the model is, however long."""
    metrics = OperatorMetrics()
    driver = driven(metrics)
    block_a_rollout(driver)
    memo = memo_of(metrics, driver.cluster)
    for _ in range(3):  # the drift timer's passes: status unchanged, the phase kept
        patch = kopf.Patch()
        reconcile_handler(body=driver.body, memo=memo, patch=patch)
        driver.body["status"] = {**driver.body.get("status", {}), **patch.get("status", {})}
        assert phases(metrics) == {("ml", "minilm"): only("Blocked")}
    driver.edit("model", dtype="auto")  # back to the serving revision's spec: no rollout, Ready
    reconcile_handler(body=driver.body, memo=memo, patch=kopf.Patch())
    assert phases(metrics)[("ml", "minilm")]["Blocked"] == 0


def test_a_deleted_model_loses_its_phase_series():
    metrics = OperatorMetrics()
    memo = memo_of(metrics, FakeCluster())
    spec = example("minilm-cpu.yaml")["spec"]
    for name in ("minilm", "other"):
        reconcile_handler(body=model_body(spec, name=name), memo=memo, patch=kopf.Patch())
    body = model_body(spec)
    for kind in (None, "ADDED", "MODIFIED"):  # the watch's other events change nothing
        deleted_handler(event={"type": kind, "object": body}, body=body, memo=memo)
    assert set(phases(metrics)) == {("ml", "minilm"), ("ml", "other")}
    deleted_handler(event={"type": "DELETED", "object": body}, body=body, memo=memo)
    assert set(phases(metrics)) == {("ml", "other")}


def test_the_handler_counts_reconciles_by_result_with_the_contracted_names():
    metrics = OperatorMetrics()

    def handle(cluster, spec):
        reconcile_handler(body=model_body(spec), memo=memo_of(metrics, cluster), patch=kopf.Patch())

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
