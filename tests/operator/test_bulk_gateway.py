"""spec.trafficClasses.bulkGateway: a second gateway for indexing traffic. Rendered as the main
gateway's pods under their own name and component label, so that neither gateway's Service (budget,
policy, monitor, spread) selects the other's pods; the workers admit it; reconcile creates its
objects, deletes them when the field goes, waits for both gateways before it retires a revision, and
reports its URL; refused with the classes off; never part of the revision."""

from __future__ import annotations

import json

import kubernetes_validate
import pydantic
import pytest
from operator_fakes import Driver, example

from kembed.operator.build import manifests as m
from kembed.operator.build import naming as n
from kembed.operator.build import policies as p
from kembed.operator.build.naming import Owner
from kembed.operator.build.revision import revision_of
from kembed.operator.crd import build_crd
from kembed.operator.spec.spec import parse_spec

OWNER = Owner("model", "ml", "0b8c1f8e-0000-4000-8000-000000000001")
IMAGE = "registry.test/kembed/gateway:1"
SCHEMA = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
BULK_KINDS = ("Deployment", "Service", "ServiceMonitor", "PodDisruptionBudget", "NetworkPolicy")


def spec_with(bulk: dict | None = None, **classes):
    body = example("bge-m3-gpu.yaml")["spec"]  # spread, a monitor, budgets and policies: everything
    body["trafficClasses"] = body["trafficClasses"] | classes
    if bulk is not None:
        body["trafficClasses"]["bulkGateway"] = bulk
    return parse_spec(body)


def selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def pod_labels(deployment: dict) -> dict:
    return deployment["spec"]["template"]["metadata"]["labels"]


def gateways(spec) -> tuple[dict, dict]:
    main = m.gateway_deployment(OWNER, spec, "r1", IMAGE)
    bulk = m.gateway_deployment(OWNER, spec, "r1", IMAGE, n.BULK_GATEWAY)
    return main, bulk


# --- rendering ------------------------------------------------------------------------------------


def test_the_bulk_gateway_runs_the_main_gateways_pods_under_its_own_name():
    """Renamed back, the bulk gateway's Deployment is the main one's but for its replica count: same
    image, environment (so the same class rule), resources, probes, security, spread and grace."""
    spec = spec_with({"replicas": 3}, bulkTokenizationProcesses=1)
    main, bulk = gateways(spec)
    assert bulk["metadata"]["name"] == "model-gateway-bulk" and bulk["spec"]["replicas"] == 3
    renamed = json.loads(json.dumps(bulk).replace(n.BULK_GATEWAY, "gateway"))
    renamed["spec"]["replicas"] = main["spec"]["replicas"]
    assert renamed == main
    service = m.gateway_service(OWNER, spec, n.BULK_GATEWAY)
    assert service["metadata"]["name"] == "model-gateway-bulk"
    assert service["spec"]["ports"] == m.gateway_service(OWNER, spec)["spec"]["ports"]


def test_neither_gateways_selectors_pick_the_others_pods():
    spec = spec_with({"replicas": 1})
    main, bulk = gateways(spec)
    main_pods, bulk_pods = pod_labels(main), pod_labels(bulk)
    by_kind = {
        "Deployment": lambda o: o["spec"]["selector"]["matchLabels"],
        "Service": lambda o: o["spec"]["selector"],
        "ServiceMonitor": lambda o: o["spec"]["selector"]["matchLabels"],
        "PodDisruptionBudget": lambda o: o["spec"]["selector"]["matchLabels"],
        "NetworkPolicy": lambda o: o["spec"]["podSelector"]["matchLabels"],
    }
    for component, own, other in (("gateway", main_pods, bulk_pods), (n.BULK_GATEWAY, bulk_pods, main_pods)):
        objects = [
            m.gateway_deployment(OWNER, spec, "r1", IMAGE, component),
            m.gateway_service(OWNER, spec, component),
            m.service_monitor(OWNER, spec, component),
            p.gateway_disruption_budget(OWNER, spec, component),
            p.gateway_network_policy(OWNER, spec, component),
        ]
        for body in objects:
            selector = by_kind[body["kind"]](body)
            assert selects(selector, own), (component, body["kind"])
            assert not selects(selector, other), (component, body["kind"])
        deployment = objects[0]
        for constraint in deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]:
            assert selects(constraint["labelSelector"]["matchLabels"], own)
            assert not selects(constraint["labelSelector"]["matchLabels"], other)


def test_the_workers_admit_the_bulk_gateway_only_when_there_is_one():
    def admitted(spec) -> bool:
        (workers, *_) = p.network_policies(OWNER, spec)
        grpc = next(
            r for r in workers["spec"]["ingress"] if {"protocol": "TCP", "port": "grpc"} in r["ports"]
        )
        bulk_pods = pod_labels(gateways(spec_with({"replicas": 1}))[1])
        return any(selects(peer["podSelector"]["matchLabels"], bulk_pods) for peer in grpc["from"])

    assert admitted(spec_with({"replicas": 1}))
    assert not admitted(spec_with())


def test_budgets_and_policies_cover_the_bulk_gateway_as_they_cover_the_gateway():
    spec = spec_with({"replicas": 2})
    budgets = {b["metadata"]["name"] for b in p.disruption_budgets(OWNER, spec, ["r1"])}
    policies = {b["metadata"]["name"] for b in p.network_policies(OWNER, spec)}
    assert {"model-gateway", "model-gateway-bulk"} <= budgets
    assert {"model-gateway", "model-gateway-bulk"} <= policies
    without = spec_with()
    assert "model-gateway-bulk" not in {
        b["metadata"]["name"] for b in p.disruption_budgets(OWNER, without, [])
    }
    assert "model-gateway-bulk" not in {b["metadata"]["name"] for b in p.network_policies(OWNER, without)}
    off = parse_spec(
        example("bge-m3-gpu.yaml")["spec"]
        | {"gateway": {"disruptionBudget": {"enabled": False}}, "trafficClasses": {"bulkGateway": {}}}
    )
    assert not [b for b in p.disruption_budgets(OWNER, off, []) if "gateway" in b["metadata"]["name"]]


@pytest.mark.parametrize("version", ["1.31.0", "1.35.0"])
def test_the_bulk_gateways_objects_are_valid_kubernetes(version):
    spec = spec_with({"replicas": 2})
    objects = [
        gateways(spec)[1],
        m.gateway_service(OWNER, spec, n.BULK_GATEWAY),
        p.gateway_disruption_budget(OWNER, spec, n.BULK_GATEWAY),
        *p.network_policies(OWNER, spec),
    ]
    for doc in objects:
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_status_url_follows_the_service_port():
    spec = parse_spec(
        example("minilm-cpu.yaml")["spec"]
        | {"gateway": {"service": {"port": 8080}}, "trafficClasses": {"bulkGateway": {}}}
    )
    assert m.gateway_url(OWNER, spec, n.BULK_GATEWAY) == "http://model-gateway-bulk.ml.svc:8080"


# --- the spec -------------------------------------------------------------------------------------


def test_the_bulk_gateway_needs_the_classes_on():
    """With the classes off no request is bulk: refused by the typed spec and by a CEL rule on the
    section (the API server's), as bulkTokenizationProcesses is."""
    with pytest.raises(pydantic.ValidationError, match="bulkGateway needs enabled"):
        spec_with({"replicas": 1}, enabled=False)
    rules = SCHEMA["properties"]["spec"]["properties"]["trafficClasses"]["x-kubernetes-validations"]
    assert "self.enabled || !has(self.bulkGateway)" in [r["rule"] for r in rules]
    assert spec_with(enabled=False).traffic_classes.bulk_gateway is None


def test_the_schema_describes_the_field_for_kubectl_explain():
    field = SCHEMA["properties"]["spec"]["properties"]["trafficClasses"]["properties"]["bulkGateway"]
    assert "default" not in field  # absent unless asked for
    replicas = field["properties"]["replicas"]
    assert (replicas["default"], replicas["minimum"], replicas["maximum"]) == (1, 1, 64)
    text = field["description"]
    for words in (
        "<model>-gateway-bulk",
        "indexing",
        "<model>-gateway",
        "same rules",
        "p99",
        "pod per replica",
    ):
        assert words in text, words
    columns = build_crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    assert {
        "name": "Bulk URL",
        "type": "string",
        "jsonPath": ".status.bulkGatewayURL",
        "priority": 1,
    } in columns


def test_the_bulk_gateway_is_not_part_of_the_revision():
    assert revision_of(spec_with({"replicas": 4}), IMAGE) == revision_of(spec_with(), IMAGE)


# --- reconcile ------------------------------------------------------------------------------------


def bulk_objects(driver: Driver) -> set[str]:
    return {kind for (kind, _, name) in driver.cluster.objects if name == "minilm-gateway-bulk"}


@pytest.fixture
def driver() -> Driver:
    spec = example("minilm-cpu.yaml")["spec"]
    spec["metrics"] = spec.get("metrics", {}) | {"serviceMonitor": True}
    return Driver(spec)


def test_setting_it_creates_the_bulk_gateway_and_rolls_no_worker(driver):
    revision = driver.promote()
    assert bulk_objects(driver) == set()
    assert "bulkGatewayURL" not in driver.body["status"]
    (workers,) = driver.cluster.named("Deployment", "worker")
    driver.edit("trafficClasses", bulkGateway={"replicas": 2})
    status = driver.step()
    assert status["activeRevision"] == revision and status["rollout"] is None
    assert driver.cluster.named("Deployment", "worker") == [workers]
    assert bulk_objects(driver) == set(BULK_KINDS)
    (bulk,) = driver.cluster.named("Deployment", n.BULK_GATEWAY)
    assert bulk["spec"]["replicas"] == 2
    assert bulk["spec"]["template"]["metadata"]["annotations"][n.REVISION_LABEL] == revision
    assert status["bulkGatewayURL"] == "http://minilm-gateway-bulk.ml.svc"
    assert status["phase"] == "Progressing"  # until the bulk gateway's pods are up
    driver.cluster.roll_gateway()
    assert driver.step()["phase"] == "Ready"


def test_removing_it_deletes_the_bulk_gateway(driver):
    driver.edit("trafficClasses", bulkGateway={"replicas": 1})
    driver.promote()
    assert bulk_objects(driver) == set(BULK_KINDS)
    del driver.body["spec"]["trafficClasses"]["bulkGateway"]
    driver.body["metadata"]["generation"] += 1
    status = driver.step()
    assert bulk_objects(driver) == set()
    assert status["bulkGatewayURL"] is None  # written as null: the merge patch removes it
    assert driver.cluster.objects[("Deployment", "ml", "minilm-gateway")]
    driver.body["status"].pop("bulkGatewayURL")  # as the API server keeps it
    assert "bulkGatewayURL" not in driver.step()
    assert status["phase"] == "Ready"


def test_a_revision_is_retired_only_once_the_bulk_gateway_left_it_too(driver):
    driver.edit("trafficClasses", bulkGateway={"replicas": 1})
    old = driver.promote()
    driver.edit("worker", maxBatchTokens=1024)
    new = driver.step()["candidateRevision"]
    driver.pass_gates(new)
    (bulk,) = driver.cluster.named("Deployment", n.BULK_GATEWAY)
    assert bulk["spec"]["template"]["metadata"]["annotations"][n.REVISION_LABEL] == new
    driver.cluster.roll_gateway(("gateway",))  # the main gateway is on the new revision, bulk is not
    status = driver.step()
    assert status["activeRevision"] == old and status["rollout"]["stage"] == "Promoting"
    assert driver.cluster.named("Deployment", "worker", old)
    driver.cluster.roll_gateway((n.BULK_GATEWAY,))
    assert driver.step()["activeRevision"] == new
    driver.step()
    assert not driver.cluster.named("Deployment", "worker", old)
