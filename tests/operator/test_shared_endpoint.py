"""Several EmbeddingModels naming one `spec.endpoint` are served by one gateway Deployment and one
Service, `<endpoint>-endpoint`, whose gateway routes each model's requests to that model's serving
workers (its KEMBED_GATEWAY_MODELS, read by the gateway's own parser); each model keeps its own
workers and rollout gate, and a rollout of one changes only its own part of the endpoint."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pydantic
import pytest
from operator_fakes import IMAGES, FakeCluster, example, model_body

from kembed.gateway.__main__ import parse_config
from kembed.gateway.endpoint import EDGE_FIELDS, model_configs
from kembed.operator.build import autoscaling as a
from kembed.operator.build import endpoint as e
from kembed.operator.build import naming as n
from kembed.operator.cluster.reconcile import InvalidSpec, reconcile
from kembed.operator.crd import build_crd
from kembed.operator.spec.spec import parse_spec

ENDPOINT = "search"


class Member:
    """One EmbeddingModel of the endpoint, reconciled against the cluster all members share."""

    def __init__(self, cluster: FakeCluster, name: str, uid: str, **worker: object) -> None:
        spec = example("minilm-cpu.yaml")["spec"] | {"endpoint": ENDPOINT}
        spec["model"] = {**spec["model"], "servedName": name}
        spec["worker"] = {**spec["worker"], **worker}  # another revision than the other member's
        self.cluster = cluster
        self.body = model_body(spec, name)
        self.body["metadata"]["uid"] = uid
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def step(self) -> dict:
        self.now += timedelta(seconds=5)
        status = reconcile(self.cluster, copy.deepcopy(self.body), IMAGES, self.now)
        self.body["status"] = json.loads(json.dumps(status))
        return self.body["status"]

    def promote(self) -> str:
        revision = self.step()["candidateRevision"]
        self.cluster.run_workers(revision)
        assert self.step()["rollout"]["stage"] == "Prewarming"
        self.cluster.finish_job("prewarm", True)
        assert self.step()["rollout"]["stage"] == "SmokeTesting"
        self.cluster.finish_job("smoke", True)
        assert self.step()["rollout"]["stage"] == "Promoting"
        self.cluster.roll_gateway((n.ENDPOINT,))
        assert self.step()["activeRevision"] == revision
        return revision


def endpoint_deployment(cluster: FakeCluster) -> dict:
    (deployment,) = cluster.named("Deployment", n.ENDPOINT)
    return deployment


def served(cluster: FakeCluster) -> dict[str, tuple[str, Path]]:
    """Each model of the endpoint's gateway: its workers and directory, as the gateway reads its env."""
    (container,) = endpoint_deployment(cluster)["spec"]["template"]["spec"]["containers"]
    env = {v["name"]: v["value"] for v in container["env"] if "value" in v}
    config = parse_config([], env)
    return {c.served_model_names[0]: (c.worker_service, c.model_dir) for c in model_configs(config)}


@pytest.fixture
def members():
    cluster = FakeCluster()
    first = Member(cluster, "minilm", "uid-1")
    second = Member(cluster, "e5", "uid-2", maxBatchTokens=1024)
    return cluster, first, second


def test_two_models_naming_one_endpoint_share_one_gateway_and_service(members):
    cluster, first, second = members
    first_revision, second_revision = first.promote(), second.promote()
    assert served(cluster) == {
        "e5": (f"e5-worker-{second_revision}.ml.svc:50051", Path("/models/e5")),
        "minilm": (f"minilm-worker-{first_revision}.ml.svc:50051", Path("/models/minilm")),
    }
    deployment = endpoint_deployment(cluster)
    pod = deployment["spec"]["template"]["spec"]
    assert {v["name"]: v["mountPath"] for v in pod["containers"][0]["volumeMounts"]} == {
        "tmp": "/tmp", "model-e5": "/models/e5", "model-minilm": "/models/minilm",
    }  # fmt: skip
    assert {v["name"] for v in pod["volumes"]} == {"tmp", "model-e5", "model-minilm"}
    (service,) = cluster.named("Service", n.ENDPOINT)
    assert service["metadata"]["name"] == deployment["metadata"]["name"] == "search-endpoint"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert deployment["spec"]["template"]["metadata"]["labels"].items() >= service["spec"]["selector"].items()
    assert {o["uid"] for o in deployment["metadata"]["ownerReferences"]} == {"uid-1", "uid-2"}
    assert cluster.named("Deployment", "gateway") == cluster.named("Service", "gateway") == []
    assert first.body["status"]["gatewayURL"] == second.body["status"]["gatewayURL"]
    assert first.body["status"]["gatewayURL"] == "http://search-endpoint.ml.svc"


def test_a_rollout_of_one_model_changes_only_its_own_part(members):
    cluster, first, second = members
    first.promote()
    second_revision = second.promote()
    second_workers = copy.deepcopy(cluster.named("Deployment", "worker", second_revision))
    first.body["spec"]["worker"]["maxBatchTokens"] = 512
    first.body["metadata"]["generation"] += 1
    new = first.promote()
    assert served(cluster)["minilm"][0] == f"minilm-worker-{new}.ml.svc:50051"
    assert served(cluster)["e5"][0] == f"e5-worker-{second_revision}.ml.svc:50051"
    annotations = endpoint_deployment(cluster)["spec"]["template"]["metadata"]["annotations"]
    assert annotations[n.endpoint_revision_key("e5")] == second_revision
    assert annotations[n.endpoint_revision_key("minilm")] == new
    assert cluster.named("Deployment", "worker", second_revision) == second_workers  # untouched
    second.step()
    assert served(cluster)["e5"][0] == f"e5-worker-{second_revision}.ml.svc:50051"


def test_each_models_workers_admit_the_endpoints_gateway_pods(members):
    cluster, first, _ = members
    first.promote()
    policies = cluster.named("NetworkPolicy", "worker")
    (policy,) = [p for p in policies if p["metadata"]["name"] == "minilm-worker"]
    clients = policy["spec"]["ingress"][0]["from"]
    assert {"podSelector": {"matchLabels": n.endpoint_selector(ENDPOINT)}} in clients


def test_the_edge_settings_are_the_endpoints_alike_on_both_sides():
    assert {f"KEMBED_GATEWAY_{name.upper()}" for name in EDGE_FIELDS} == e.EDGE_VARIABLES


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"trafficClasses": {"bulkGateway": {"replicas": 1}}}, "bulk gateway"),
        ({"gateway": {"autoscaling": {"enabled": True}}}, "not autoscaled"),
    ],
    ids=["bulk-gateway", "autoscaled-gateway"],
)
def test_what_an_endpoint_member_cannot_have_is_refused(extra, match):
    spec = example("minilm-cpu.yaml")["spec"] | {"endpoint": ENDPOINT}
    for section, fields in extra.items():
        spec[section] = {**spec.get(section, {}), **fields}
    with pytest.raises(pydantic.ValidationError, match=match):
        parse_spec(spec)
    with pytest.raises(InvalidSpec, match=match):
        reconcile(FakeCluster(), model_body(spec), IMAGES, datetime(2026, 1, 1, tzinfo=UTC))


def test_kubectl_explain_says_what_endpoint_does():
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    described = schema["properties"]["endpoint"]["description"]
    assert "shared endpoint" in described and "<endpoint>-endpoint" in described


def test_a_member_at_zero_is_woken_by_its_own_held_requests_at_the_endpoint():
    spec = parse_spec(
        example("shared-endpoint.yaml")["spec"]
    )  # scaleToZero on: the endpoint's pods, this model's series
    owner = n.Owner("minilm-search", "ml", "uid-1")
    assert a.held_query(owner, spec) == (
        'sum(kembed_gateway_held_requests{namespace="ml", pod=~"search-endpoint-[a-z0-9]+-[a-z0-9]+", '
        'model="sentence-transformers/all-MiniLM-L6-v2"}) > bool 0'
    )
