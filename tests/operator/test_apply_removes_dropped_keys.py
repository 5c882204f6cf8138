"""`apply` against the in-memory API (a JSON merge patch as the API server applies it): a key the
rendered body no longer has leaves the live object, as `kubectl apply` would take it out, except a
Deployment's replicas once an autoscaler owns them; objects applied before the key record existed
are patched once to gain it."""

from __future__ import annotations

from operator_fakes import FakeCluster

from kembed.operator.cluster.apply import APPLIED_HASH, APPLIED_KEYS, _hash, apply


def deployment(replicas: int | None = 2, node_selector: dict | None = None, **pod: object) -> dict:
    spec: dict = {
        "selector": {"matchLabels": {"app": "g"}},
        "template": {
            "metadata": {"labels": {"app": "g"}},
            "spec": {"containers": [{"name": "g", "image": "i"}], **pod},
        },
    }
    if replicas is not None:
        spec["replicas"] = replicas
    if node_selector is not None:
        spec["template"]["spec"]["nodeSelector"] = node_selector
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "g", "namespace": "ml"},
        "spec": spec,
    }


def live(cluster: FakeCluster) -> dict:
    return cluster.objects[("Deployment", "ml", "g")]


def test_a_dropped_nested_key_and_a_dropped_object_leave_the_live_object():
    cluster = FakeCluster()
    apply(
        cluster, deployment(node_selector={"gpu": "h200", "zone": "a"}, affinity={"nodeAffinity": {"x": 1}})
    )
    apply(cluster, deployment(node_selector={"gpu": "h200"}))
    pod = live(cluster)["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"gpu": "h200"}
    assert "affinity" not in pod
    assert pod["containers"] == [{"name": "g", "image": "i"}]


def test_replicas_an_autoscaler_owns_are_never_nulled():
    cluster = FakeCluster()
    apply(cluster, deployment(replicas=3))
    apply(cluster, deployment(replicas=None, node_selector={"gpu": "h200"}))  # autoscaled from now on
    assert live(cluster)["spec"]["replicas"] == 3
    assert live(cluster)["spec"]["template"]["spec"]["nodeSelector"] == {"gpu": "h200"}


def test_the_same_body_again_is_not_patched():
    cluster = FakeCluster()
    apply(cluster, deployment())
    apply(cluster, deployment())
    assert [verb for verb, kind in cluster.calls if kind == "Deployment"] == ["get", "create", "get"]


def test_an_object_applied_before_the_key_record_gains_it_and_then_drops_keys():
    cluster = FakeCluster()
    old = deployment(node_selector={"gpu": "h200", "zone": "a"})
    old["metadata"]["annotations"] = {
        APPLIED_HASH: _hash(deployment(node_selector={"gpu": "h200", "zone": "a"}))
    }
    cluster.create(old)  # as an operator without APPLIED_KEYS left it
    apply(cluster, deployment(node_selector={"gpu": "h200", "zone": "a"}))  # same body: patched once
    assert APPLIED_KEYS in live(cluster)["metadata"]["annotations"]
    apply(cluster, deployment(node_selector={"gpu": "h200"}))
    assert live(cluster)["spec"]["template"]["spec"]["nodeSelector"] == {"gpu": "h200"}
