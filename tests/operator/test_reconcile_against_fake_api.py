"""`reconcile` end to end against the in-memory API: objects made, Jobs run, gateway switched,
old revisions retired, blocks reported, drift repaired — with every call inside RBAC_RULES."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from operator_fakes import IMAGES, Driver, FakeCluster, example, model_body

from kembed.operator.build import naming as n
from kembed.operator.cluster.reconcile import Images, InvalidSpec, reconcile


@pytest.fixture
def driver() -> Driver:
    return Driver(example("minilm-cpu.yaml")["spec"])


def test_first_rollout_goes_through_prewarm_and_smoke_to_ready(driver):
    status = driver.step()
    revision = status["candidateRevision"]
    assert status["phase"] == "Progressing" and status["rollout"]["stage"] == "Deploying"
    assert [d["metadata"]["name"] for d in driver.cluster.named("Deployment", "worker")] == [
        f"minilm-worker-{revision}"
    ]
    assert driver.cluster.named("Deployment", "gateway") == []  # nothing to point it at yet
    assert driver.cluster.named("Service", "gateway")

    driver.cluster.run_workers(revision)
    assert driver.step()["rollout"]["targets"] == ["10.0.10.1:50051"]
    (prewarm,) = driver.cluster.named("Job", "prewarm")
    assert prewarm["spec"]["template"]["spec"]["containers"][0]["command"][:4] == [
        "kembed-worker",
        "prewarm",
        "--target",
        "10.0.10.1:50051",
    ]
    driver.cluster.finish_job("prewarm", True)
    driver.step()
    assert driver.condition("Prewarmed")["status"] == "True"
    driver.cluster.finish_job("smoke", True)
    status = driver.step()
    assert driver.condition("SmokeTestPassed")["status"] == "True"
    (gateway,) = driver.cluster.named("Deployment", "gateway")
    assert gateway["spec"]["template"]["metadata"]["annotations"][n.REVISION_LABEL] == revision

    driver.cluster.roll_gateway()
    status = driver.step()
    assert status["phase"] == "Ready" and status["activeRevision"] == revision
    assert status["rollout"] is None and status["candidateRevision"] == ""
    assert status["readyReplicas"] == 1 and status["gatewayURL"] == "http://minilm-gateway.ml.svc"
    assert driver.cluster.named("Job", "prewarm") == driver.cluster.named("Job", "smoke") == []
    assert driver.cluster.named("Job", "golden") == []
    assert [e[1] for e in driver.cluster.events] == [
        "RolloutStarted",
        "Prewarmed",
        "SmokeTestPassed",
        "GoldenRecorded",  # the first revision of these weights: its golden answer is kept
        "Promoted",
    ]


def test_spec_change_rolls_out_a_new_revision_and_retires_the_old(driver):
    old = driver.promote()
    driver.edit("worker", maxBatchTokens=1024)
    new = driver.step()["candidateRevision"]
    assert new != old
    assert {
        d["metadata"]["labels"][n.REVISION_LABEL] for d in driver.cluster.named("Deployment", "worker")
    } == {old, new}
    driver.cluster.run_workers(new, ip_base=20)
    driver.step()
    (prewarm,) = driver.cluster.named("Job", "prewarm")
    command = prewarm["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--hot-from") + 1] == "10.0.10.1:50051"  # hot buckets of the serving pods
    driver.cluster.finish_job("prewarm", True)
    driver.step()
    driver.cluster.finish_job("smoke", True)
    driver.step()
    # Promoting: the old revision keeps serving until every gateway pod points at the new one.
    assert {
        d["metadata"]["labels"][n.REVISION_LABEL] for d in driver.cluster.named("Deployment", "worker")
    } == {old, new}
    driver.cluster.roll_gateway()
    status = driver.step()
    assert status["activeRevision"] == new and status["phase"] == "Ready"
    assert [d["metadata"]["name"] for d in driver.cluster.named("Deployment", "worker")] == [
        f"minilm-worker-{new}"
    ]
    assert (
        driver.cluster.named("Service", "worker", old)
        == driver.cluster.named("ConfigMap", "worker", old)
        == []
    )


def test_failed_smoke_test_blocks_and_the_old_revision_keeps_serving(driver):
    old = driver.promote()
    (gateway_before,) = driver.cluster.named("Deployment", "gateway")
    driver.edit("model", dtype="float16")
    new = driver.step()["candidateRevision"]
    driver.cluster.run_workers(new, ip_base=20)
    driver.step()
    driver.cluster.finish_job("prewarm", True)
    driver.step()
    driver.cluster.finish_job(
        "smoke", False, report="smoke 10.0.20.1:50051: FAILED\n  FAIL 8x512 min cosine 0.12"
    )
    status = driver.step()
    blocked = driver.condition("RolloutBlocked")
    assert (
        status["phase"] == "Blocked"
        and blocked["status"] == "True"
        and blocked["reason"] == "SmokeTestFailed"
    )
    assert "min cosine 0.12" in blocked["message"]
    assert status["activeRevision"] == old and driver.condition("Ready")["status"] == "True"
    assert driver.cluster.named("Deployment", "gateway") == [gateway_before]  # untouched
    assert driver.cluster.named("Deployment", "worker", new) == []  # its GPUs freed
    assert driver.cluster.named("Job", "smoke")  # kept for its logs
    assert ("Warning", "RolloutBlocked") in [e[:2] for e in driver.cluster.events]
    assert driver.step()["phase"] == "Blocked"  # stays blocked until the spec changes

    driver.edit("rollout", minCosine=0.99)  # a later spec change retries
    status = driver.step()
    assert status["rollout"]["stage"] == "Deploying" and status["rollout"]["attempt"] == 2
    assert driver.condition("RolloutBlocked")["status"] == "False"


def test_scaling_workers_is_not_a_rollout(driver):
    revision = driver.promote()
    driver.edit("worker", replicas=3)
    status = driver.step()
    assert status["activeRevision"] == revision and status["rollout"] is None
    (deployment,) = driver.cluster.named("Deployment", "worker")
    assert deployment["spec"]["replicas"] == 3
    assert status["phase"] == "Progressing"  # the gateway rolls to dial three workers


def test_a_prewarm_change_reaches_new_pods_without_a_rollout_or_a_restart(driver):
    revision = driver.promote()
    (before,) = driver.cluster.named("Deployment", "worker")
    driver.edit("graphs", startupPrewarm="none", prewarmSeconds=30)
    status = driver.step()
    assert status["activeRevision"] == revision and status["rollout"] is None
    assert driver.cluster.named("Deployment", "worker") == [before]  # same pod template: no restart
    (config_map,) = driver.cluster.named("ConfigMap", "worker")
    assert config_map["data"]["KEMBED_WORKER_PREWARM"] == "none"  # replaced, for pods started later
    assert config_map["data"]["KEMBED_WORKER_PREWARM_SECONDS"] == "30"


def test_drift_is_repaired(driver):
    revision = driver.promote()
    del driver.cluster.objects[("Service", "ml", "minilm-gateway")]
    driver.cluster.objects[("Deployment", "ml", f"minilm-worker-{revision}")]["spec"]["replicas"] = 7
    driver.step()
    assert driver.cluster.named("Service", "gateway")
    assert driver.cluster.named("Deployment", "worker")[0]["spec"]["replicas"] == 1


def test_a_steady_pass_writes_nothing(driver):
    driver.promote()
    driver.cluster.calls.clear()
    driver.step()
    assert {verb for verb, _ in driver.cluster.calls} <= {"get", "list"}


def test_a_spec_without_images_is_invalid():
    driver = Driver(example("minilm-cpu.yaml")["spec"])
    with pytest.raises(InvalidSpec, match="image"):
        reconcile(driver.cluster, driver.body, Images("", ""), driver.now)


def test_a_spec_the_schema_would_refuse_is_invalid():
    body = model_body({"model": {"source": {"hostPath": {"path": "/m"}}}, "worker": {"replicas": -1}})
    with pytest.raises(InvalidSpec, match=r"worker\.replicas"):
        reconcile(FakeCluster(), body, IMAGES, datetime(2026, 1, 1, tzinfo=UTC))
