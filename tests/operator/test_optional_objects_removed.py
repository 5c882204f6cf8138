"""Objects the operator makes only for some specs go when the spec stops asking for them: the
Prometheus operator's monitors (metrics.serviceMonitor), the bulk gateway's objects, the gateway's
autoscaler. Against the in-memory API; and KubeCluster, which asks for an absent one only once."""

from __future__ import annotations

from typing import Any

import pytest
from operator_fakes import Driver, example

from kembed.operator.cluster.cluster import KubeCluster

MONITORS = ("ServiceMonitor", "PodMonitor")


def monitors(driver: Driver) -> list[tuple[str, str]]:
    return sorted((kind, name) for (kind, _, name) in driver.cluster.objects if kind in MONITORS)


@pytest.fixture
def driver() -> Driver:
    spec = example("minilm-cpu.yaml")["spec"]
    spec["metrics"] = {**spec.get("metrics", {}), "serviceMonitor": True}
    spec["trafficClasses"] = {**spec.get("trafficClasses", {}), "bulkGateway": {"replicas": 1}}
    return Driver(spec)


def test_turning_service_monitors_off_deletes_every_one_made(driver):
    driver.promote()
    assert monitors(driver) == [
        ("PodMonitor", "minilm-worker"),
        ("ServiceMonitor", "minilm-gateway"),
        ("ServiceMonitor", "minilm-gateway-bulk"),
    ]
    driver.edit("metrics", serviceMonitor=False)
    driver.step()
    assert monitors(driver) == []
    driver.edit("metrics", serviceMonitor=True)
    driver.step()
    assert len(monitors(driver)) == 3


def test_unsetting_the_bulk_gateway_takes_its_monitor_and_leaves_the_others(driver):
    driver.promote()
    del driver.body["spec"]["trafficClasses"]["bulkGateway"]
    driver.step()
    assert monitors(driver) == [("PodMonitor", "minilm-worker"), ("ServiceMonitor", "minilm-gateway")]
    assert not [key for key in driver.cluster.objects if key[2] == "minilm-gateway-bulk"]


class RecordingKubeCluster(KubeCluster):
    """KubeCluster's logic over a dict instead of an API server: each call recorded as (method, path),
    404 (None) for what the dict lacks, as `_call` answers."""

    def __init__(self) -> None:
        super().__init__(api=None, timeout_s=1.0)  # type: ignore[arg-type]
        self.stored: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []

    def _call(self, method, path, body=None, query=None, content_type="application/json"):
        self.calls.append((method, path))
        if method == "POST":
            self.stored[f"{path}/{body['metadata']['name']}"] = body
            return body
        if method == "DELETE":
            return self.stored.pop(path, None)
        if method == "PATCH":
            self.stored[path] = body
        return self.stored.get(path)


def service_monitor(name: str) -> dict[str, Any]:
    return {"kind": "ServiceMonitor", "metadata": {"name": name, "namespace": "ml"}}


def test_kube_cluster_asks_for_an_absent_optional_object_once():
    cluster = RecordingKubeCluster()
    path = "/apis/monitoring.coreos.com/v1/namespaces/ml/servicemonitors/minilm-gateway"
    for _ in range(3):  # every reconcile pass of a model without one
        cluster.delete_if_present("ServiceMonitor", "ml", "minilm-gateway")
    assert cluster.calls == [("GET", path)]


@pytest.mark.parametrize("write", ["create", "patch"])
def test_kube_cluster_asks_again_once_it_has_written_the_object(write):
    cluster = RecordingKubeCluster()
    path = "/apis/monitoring.coreos.com/v1/namespaces/ml/servicemonitors/minilm-gateway"
    cluster.delete_if_present("ServiceMonitor", "ml", "minilm-gateway")
    if write == "create":
        cluster.create(service_monitor("minilm-gateway"))
    else:
        cluster.stored[path] = service_monitor("minilm-gateway")  # made by an earlier operator process
        cluster.patch("ServiceMonitor", "ml", "minilm-gateway", service_monitor("minilm-gateway"))
    cluster.calls.clear()
    cluster.delete_if_present("ServiceMonitor", "ml", "minilm-gateway")
    cluster.delete_if_present("ServiceMonitor", "ml", "minilm-gateway")
    assert cluster.calls == [("GET", path), ("DELETE", path)]
    assert path not in cluster.stored


def test_kube_cluster_deletes_an_object_present_when_first_asked():
    """A fresh operator process (no memory) finds what an earlier one made and deletes it."""
    cluster = RecordingKubeCluster()
    path = "/apis/monitoring.coreos.com/v1/namespaces/ml/servicemonitors/minilm-gateway"
    cluster.stored[path] = service_monitor("minilm-gateway")
    cluster.delete_if_present("ServiceMonitor", "ml", "minilm-gateway")
    assert cluster.calls == [("GET", path), ("DELETE", path)] and not cluster.stored
