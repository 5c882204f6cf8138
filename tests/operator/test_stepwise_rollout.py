"""A stepwise rollout (rollout.maxSurgeReplicas): a canary gated beside the serving pods, then (if it
answers as the serving weights do) both revisions serve through one gateway while each step moves s
pods over, each step's new pods gated by Jobs of their own; never more than R + s pods asked. Against
the in-memory API (the real gateway's two-Service pool: tests/gateway/test_worker_discovery.py)."""

from __future__ import annotations

import pytest
from operator_fakes import Driver, example, golden_log

from kembed.operator.build import naming as n

R, S = 3, 1


@pytest.fixture
def driver():
    spec = example("minilm-cpu.yaml")["spec"]
    spec["worker"]["replicas"] = R
    driver = Driver(spec | {"rollout": {"maxSurgeReplicas": S}})
    driver.old = driver.promote()  # the first revision: nothing to step beside, all at once
    driver.edit("worker", maxBatchTokens=1024)
    return driver


def asked(driver: Driver) -> dict[str, int]:
    return {
        d["metadata"]["labels"][n.REVISION_LABEL]: d["spec"]["replicas"]
        for d in driver.cluster.named("Deployment", "worker")
    }


def gateway(driver: Driver) -> tuple[str, str]:
    (deployment,) = driver.cluster.named("Deployment", "gateway")
    template = deployment["spec"]["template"]
    env = {e["name"]: e.get("value") for e in template["spec"]["containers"][0]["env"]}
    return template["metadata"]["annotations"][n.REVISION_LABEL], env["KEMBED_GATEWAY_WORKER_SERVICE"]


def gate_step(driver: Driver, revision: str, pods: int) -> dict:
    """The candidate's Deployment has `pods` ready pods; its new ones pass prewarm, smoke and golden."""
    driver.cluster.run_workers(revision, ip_base=30)
    assert driver.step()["rollout"]["stage"] == "Prewarming"
    driver.cluster.finish_job("prewarm", True)
    assert driver.step()["rollout"]["stage"] == "SmokeTesting"
    (golden,) = driver.cluster.named("Job", "golden")
    command = golden["spec"]["template"]["spec"]["containers"][0]["command"]
    driver.golden_targets = [command[i + 1] for i, a in enumerate(command) if a == "--target"]
    driver.cluster.finish_job("smoke", True)
    return driver.step()


def test_an_alike_revision_moves_over_a_pod_a_step_through_both_revisions(driver):
    old = driver.old
    new = driver.step()["candidateRevision"]
    assert asked(driver) == {old: R, new: S}  # the canary beside every serving pod
    status = gate_step(driver, new, S)
    assert status["rollout"]["stage"] == "Mixing"
    revision, services = gateway(driver)
    assert revision == f"{old}+{new}"
    assert services == f"minilm-worker-{old}.ml.svc:50051,minilm-worker-{new}.ml.svc:50051"
    assert asked(driver) == {old: R, new: S}  # nothing moves until the gateway serves from both

    driver.cluster.roll_gateway()
    status = driver.step()
    rollout = status["rollout"]
    assert (rollout["stage"], rollout["stepReplicas"], rollout["attempt"]) == ("Deploying", 2, 2)
    assert status["rollout"]["gated"] == ["10.0.30.1:50051"]
    assert asked(driver) == {old: R + S - 2, new: 2}
    status = gate_step(driver, new, 2)
    assert sum(asked(driver).values()) <= R + S
    assert driver.golden_targets == ["10.0.30.1:50051", "10.0.30.2:50051"]  # the new pod vs a gated one
    assert status["rollout"]["stage"] == "Deploying" and status["rollout"]["stepReplicas"] == R
    assert asked(driver) == {old: 1, new: R}
    assert gateway(driver)[0] == f"{old}+{new}"

    status = gate_step(driver, new, R)
    assert status["rollout"]["stage"] == "Promoting"
    assert gateway(driver)[0] == new
    driver.cluster.roll_gateway()
    status = driver.step()
    assert status["activeRevision"] == new and status["phase"] == "Ready"
    assert asked(driver) == {new: R}
    reasons = [reason for _, reason, _ in driver.cluster.events]
    assert reasons[reasons.index("RolloutStarted", 5) :].count("SteppedUp") == 2 and "Mixing" in reasons


def test_new_weights_are_never_mixed_they_grow_beside_the_serving_revision(driver):
    driver.cluster.golden_log = golden_log(weights="cd" * 32)
    new = driver.step()["candidateRevision"]
    status = gate_step(driver, new, S)
    assert status["rollout"]["stage"] == "Deploying" and "stepReplicas" not in status["rollout"]
    assert asked(driver) == {driver.old: R, new: R}
    assert gateway(driver)[0] == driver.old
    warning = [m for t, reason, m in driver.cluster.events if reason == "StepwiseNotMixed"]
    assert len(warning) == 1 and "is not mixed" in warning[0]
    status = gate_step(driver, new, R)
    assert status["rollout"]["stage"] == "Promoting"
    assert driver.cluster.events[-1][1] == "GoldenRecorded"


def test_a_failed_step_puts_the_gateway_back_on_the_serving_revision_at_its_size(driver):
    new = driver.step()["candidateRevision"]
    gate_step(driver, new, S)
    driver.cluster.roll_gateway()
    driver.step()
    assert asked(driver)[driver.old] == R + S - 2
    driver.cluster.run_workers(new, ip_base=30)
    driver.step()
    driver.cluster.finish_job("prewarm", True)
    driver.step()
    driver.cluster.finish_job("smoke", False, report="FAIL 8x512 min cosine 0.21")
    status = driver.step()
    assert status["phase"] == "Blocked" and status["activeRevision"] == driver.old
    assert gateway(driver) == (driver.old, f"minilm-worker-{driver.old}.ml.svc:50051")
    # the candidate's pods are kept while a gateway pod still sends them work, and the serving
    # revision grows back only as they go: never more than R + S pods (was R + 2)
    assert asked(driver) == {driver.old: R + S - 2, new: 2}
    driver.cluster.roll_gateway()
    driver.step()
    driver.step()
    assert asked(driver) == {driver.old: R}


def passes(driver: Driver, num: int) -> list[dict[str, int]]:
    """What each of `num` passes asks (the gateway rolled out after each)."""
    seen = []
    for _ in range(num):
        driver.step()
        driver.cluster.roll_gateway()
        seen.append(asked(driver))
    return seen


def test_a_spec_moving_on_mid_step_takes_the_gateway_back_first(driver):
    """Back to the serving revision's own spec while the revisions mix: the gateway goes back onto
    it, which grows back to R as the candidate's pods go, never past R + S (was: R beside the
    candidate's 2, and 5 pods against 4 for as long as the gateway took to roll)."""
    new = driver.step()["candidateRevision"]
    gate_step(driver, new, S)
    driver.cluster.roll_gateway()
    driver.step()
    assert asked(driver) == {driver.old: R + S - 2, new: 2}
    driver.edit("worker", maxBatchTokens=2048)  # the serving revision's spec again
    status = driver.step()
    assert status["candidateRevision"] == "" and gateway(driver)[0] == driver.old
    assert sum(asked(driver).values()) <= R + S
    seen = passes(driver, 3)
    assert all(sum(pods.values()) <= R + S for pods in seen), seen
    assert seen[-1] == {driver.old: R}


def test_a_spec_moving_on_to_another_revision_while_mixing_holds_r_plus_s_pods(driver):
    """A third revision while the first two mix: the second's pods are held until the gateway is
    off them, the serving revision then grows back to R, and only then does the third start its
    canary; R + S pods at most in every pass (was 6 against 4: R, the second's 2, the third's 1)."""
    new = driver.step()["candidateRevision"]
    gate_step(driver, new, S)
    driver.cluster.roll_gateway()
    driver.step()
    driver.edit("worker", maxBatchTokens=512)
    status = driver.step()
    third = status["candidateRevision"]
    assert third not in (new, driver.old) and gateway(driver)[0] == driver.old
    assert sum(asked(driver).values()) <= R + S, asked(driver)
    seen = passes(driver, 3)
    assert all(sum(pods.values()) <= R + S for pods in seen), seen
    assert seen[-1] == {driver.old: R, third: S}
    status = gate_step(driver, third, S)
    assert status["rollout"]["stage"] == "Mixing"
