"""`reconcile` keeps a model's PodDisruptionBudgets and NetworkPolicies exactly as the spec asks,
against the in-memory API (every call inside RBAC_RULES): created with the rest, owned by the model,
a budget per kept worker revision, updated in place when a setting changes (a field the new body
drops is removed, not left behind by the merge patch), deleted when switched off or retired."""

from __future__ import annotations

import pytest
from operator_fakes import Driver, example

from kembed.operator.build import naming as n


@pytest.fixture
def driver() -> Driver:
    return Driver(example("minilm-cpu.yaml")["spec"])


def names(driver: Driver, kind: str) -> list[str]:
    return sorted(name for (k, _, name) in driver.cluster.objects if k == kind)


def live(driver: Driver, kind: str, name: str) -> dict:
    return driver.cluster.objects[(kind, "ml", name)]


def test_the_first_pass_creates_budgets_and_policies_owned_by_the_model(driver):
    revision = driver.step()["candidateRevision"]
    assert names(driver, "PodDisruptionBudget") == ["minilm-gateway", f"minilm-worker-{revision}"]
    assert names(driver, "NetworkPolicy") == ["minilm-gateway", "minilm-worker"]
    for kind in ("PodDisruptionBudget", "NetworkPolicy"):
        for name in names(driver, kind):
            owners = live(driver, kind, name)["metadata"]["ownerReferences"]
            assert [(o["kind"], o["name"], o["uid"]) for o in owners] == [
                ("EmbeddingModel", "minilm", "uid-1")
            ]


def test_a_retired_revision_takes_its_budget_with_it(driver):
    first = driver.promote()
    driver.edit("worker", maxBatchTokens=1024)
    second = driver.step()["candidateRevision"]
    assert names(driver, "PodDisruptionBudget") == sorted(
        ["minilm-gateway", f"minilm-worker-{first}", f"minilm-worker-{second}"]
    )
    driver.pass_gates(second)
    driver.cluster.roll_gateway()
    assert driver.step()["activeRevision"] == second
    driver.step()
    assert names(driver, "PodDisruptionBudget") == ["minilm-gateway", f"minilm-worker-{second}"]
    assert not driver.cluster.named("Deployment", "worker", first)


def test_a_blocked_candidate_keeps_no_budget(driver):
    first = driver.promote()
    driver.edit("worker", maxBatchTokens=1024)
    second = driver.step()["candidateRevision"]
    driver.cluster.run_workers(second, ip_base=20)
    driver.step()
    driver.cluster.finish_job("prewarm", False, "bucket 8x512 failed")
    assert driver.step()["phase"] == "Blocked"
    assert names(driver, "PodDisruptionBudget") == ["minilm-gateway", f"minilm-worker-{first}"]


def test_a_budget_setting_is_patched_in_place_and_the_replaced_limit_removed(driver):
    revision = driver.promote()
    name = f"minilm-worker-{revision}"
    assert live(driver, "PodDisruptionBudget", name)["spec"]["maxUnavailable"] == 1
    driver.edit("worker", disruptionBudget={"minAvailable": "50%"})
    assert driver.step()["activeRevision"] == revision  # not a rollout
    budget = live(driver, "PodDisruptionBudget", name)["spec"]
    assert budget["minAvailable"] == "50%" and "maxUnavailable" not in budget
    assert ("patch", "PodDisruptionBudget") in driver.cluster.calls


def test_switching_budgets_and_policies_off_deletes_them(driver):
    driver.promote()
    driver.edit("worker", disruptionBudget={"enabled": False})
    driver.edit("networkPolicy", enabled=False)
    driver.step()
    assert names(driver, "PodDisruptionBudget") == ["minilm-gateway"]
    assert names(driver, "NetworkPolicy") == []
    driver.edit("gateway", disruptionBudget={"enabled": False})
    driver.step()
    assert names(driver, "PodDisruptionBudget") == []
    driver.edit("networkPolicy", enabled=True)
    driver.step()
    assert names(driver, "NetworkPolicy") == ["minilm-gateway", "minilm-worker"]


def test_a_policy_change_is_patched_in_place(driver):
    driver.promote()
    driver.edit("networkPolicy", gatewayFrom=[{"ipBlock": {"cidr": "10.0.0.0/8"}}])
    driver.step()
    (rule,) = live(driver, "NetworkPolicy", "minilm-gateway")["spec"]["ingress"]
    assert rule["from"] == [{"ipBlock": {"cidr": "10.0.0.0/8"}}]
    driver.edit("networkPolicy", gatewayFrom=[])
    driver.step()
    (rule,) = live(driver, "NetworkPolicy", "minilm-gateway")["spec"]["ingress"]
    assert "from" not in rule


def test_unsetting_a_gateway_priority_class_removes_it_from_the_pods(driver):
    driver.promote()
    driver.edit("gateway", priorityClassName="kembed-serving", topologySpread={"nodes": "DoNotSchedule"})
    driver.step()
    (gateway,) = driver.cluster.named("Deployment", "gateway")
    assert gateway["spec"]["template"]["spec"]["priorityClassName"] == "kembed-serving"
    driver.body["spec"]["gateway"] = {
        k: v for k, v in driver.body["spec"]["gateway"].items() if k != "priorityClassName"
    } | {"topologySpread": {"nodes": "Off", "zones": "Off"}}
    driver.body["metadata"]["generation"] += 1
    driver.step()
    (gateway,) = driver.cluster.named("Deployment", "gateway")
    pod = gateway["spec"]["template"]["spec"]
    assert "priorityClassName" not in pod and "topologySpreadConstraints" not in pod


def test_budgets_and_policies_of_another_model_are_left_alone(driver):
    driver.step()
    stranger = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {
            "name": "other-gateway",
            "namespace": "ml",
            "labels": {n.MODEL_LABEL: "other", "app.kubernetes.io/managed-by": n.MANAGED_BY},
        },
        "spec": {"maxUnavailable": 1},
    }
    driver.cluster.objects[("PodDisruptionBudget", "ml", "other-gateway")] = stranger
    driver.step()
    assert ("PodDisruptionBudget", "ml", "other-gateway") in driver.cluster.objects


def test_a_drifted_budget_is_repaired(driver):
    revision = driver.promote()
    name = f"minilm-worker-{revision}"
    del driver.cluster.objects[("PodDisruptionBudget", "ml", name)]
    driver.step()
    assert live(driver, "PodDisruptionBudget", name)["spec"]["maxUnavailable"] == 1
