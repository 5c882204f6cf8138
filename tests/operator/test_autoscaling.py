"""spec.autoscaling and spec.gateway.autoscaling: the KEDA ScaledObject and the gateway HPA as rendered
(defaults, each setting, a golden file), valid against their schemas, and the operator leaving
`replicas` to the autoscaler through a whole rollout against the fake API.

KEDA's CRD is in no package this repository can install, so the ScaledObject is validated against
fixtures/keda-scaledobject-schema.yaml: a minimal schema written from KEDA's documented ScaledObject
spec and checked field by field against KEDA 2.20's CRD (the fixture's header says how it differs).
The HPA is a built-in kind: kubernetes-validate checks it strictly, as it does every other manifest.
"""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path

import jsonschema
import kubernetes_validate
import pydantic
import pytest
import yaml
from operator_fakes import Driver, FakeCluster, example

from kembed.gateway.__main__ import parse_config as parse_gateway_config
from kembed.operator.build import autoscaling as a
from kembed.operator.build import manifests as m
from kembed.operator.build.naming import Owner
from kembed.operator.build.revision import revision_of
from kembed.operator.crd import CEL_RULES, build_crd
from kembed.operator.spec.spec import parse_spec

HERE = Path(__file__).parent
KEDA_SCHEMA = yaml.safe_load((HERE / "fixtures" / "keda-scaledobject-schema.yaml").read_text())
CRD_SCHEMA = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
GOLDEN = HERE / "golden" / "autoscaling.yaml"
OWNER = Owner("model", "ml", "0b8c1f8e-0000-4000-8000-000000000001")
IMAGE = "registry.test/kembed/worker:1"
PROMETHEUS = "http://prometheus-operated.monitoring.svc:9090"
ON = {"enabled": True, "prometheusAddress": PROMETHEUS}


def spec_with(
    autoscaling: dict | None = None, gateway_autoscaling: dict | None = None, base="bge-m3-gpu.yaml"
):
    raw = example(base)["spec"]
    if autoscaling is not None:
        raw["autoscaling"] = autoscaling
    if gateway_autoscaling is not None:
        raw.setdefault("gateway", {})["autoscaling"] = gateway_autoscaling
    return parse_spec(raw)


def keda_errors(doc: dict) -> list[str]:
    found = [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
        for e in jsonschema.Draft7Validator(KEDA_SCHEMA).iter_errors(doc)
    ]
    s = doc["spec"]
    if s.get("minReplicaCount", 0) > s.get("maxReplicaCount", 100):  # KEDA's CEL rule
        found.append("minReplicaCount must be less than or equal to maxReplicaCount")
    for trigger in s["triggers"]:  # what KEDA's Prometheus scaler parses from its metadata
        if trigger["type"] == "prometheus":
            meta = trigger["metadata"]
            assert {"serverAddress", "query", "threshold"} <= set(meta), meta
            float(meta["threshold"])
    return found


# --- the ScaledObject ---------------------------------------------------------------------------


def test_defaults_render_one_queue_trigger_on_the_serving_revision():
    spec = spec_with(ON)
    rev = revision_of(spec, IMAGE)
    scaled = a.scaled_object(OWNER, spec, rev)
    assert scaled["apiVersion"] == "keda.sh/v1alpha1" and scaled["kind"] == "ScaledObject"
    assert scaled["metadata"]["name"] == f"model-worker-{rev}"
    assert scaled["metadata"]["ownerReferences"] == [OWNER.reference()]
    body = scaled["spec"]
    assert body["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": f"model-worker-{rev}",
    }
    assert (body["minReplicaCount"], body["maxReplicaCount"]) == (1, 4)
    assert body["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == {
        "scaleDown": {"stabilizationWindowSeconds": 300}
    }
    assert "cooldownPeriod" not in body  # only the step to zero pods waits for it
    (trigger,) = body["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    assert trigger["metadata"] == {
        "serverAddress": PROMETHEUS,
        "query": "sum(kembed_worker_queued_tokens"
        f'{{namespace="ml", pod=~"model-worker-{rev}-[a-z0-9]+-[a-z0-9]+"}})',
        "threshold": "8192",
    }
    assert keda_errors(scaled) == []


# The gateway pods' held requests (the model's gateway and bulk gateway): what wakes a model at zero.
GATEWAY_PODS = "model-gateway(-bulk)?-[a-z0-9]+-[a-z0-9]+"
HELD_QUERY = f'sum(kembed_gateway_held_requests{{namespace="ml", pod=~"{GATEWAY_PODS}"}}) > bool 0'
# setting -> (what to find in the ScaledObject's spec, at a path, as that value)

SETTINGS = {
    "min-max": (
        {"minReplicas": 2, "maxReplicas": 16},
        [(("minReplicaCount",), 2), (("maxReplicaCount",), 16)],
    ),
    "target": ({"targetQueuedTokensPerReplica": 4096}, [(("triggers", 0, "metadata", "threshold"), "4096")]),
    "scale-down-window": (
        {"scaleDownStabilizationSeconds": 900},
        [
            (
                (
                    "advanced",
                    "horizontalPodAutoscalerConfig",
                    "behavior",
                    "scaleDown",
                    "stabilizationWindowSeconds",
                ),
                900,
            )
        ],
    ),
    "prometheus": (
        {"prometheusAddress": "https://thanos-query.obs:10902"},
        [(("triggers", 0, "metadata", "serverAddress"), "https://thanos-query.obs:10902")],
    ),
    "prometheus-auth": (
        {"prometheusAuth": {"authModes": ["bearer", "tls"], "authenticationRef": {"name": "prometheus"}}},
        [
            (("triggers", 0, "metadata", "authModes"), "bearer,tls"),
            (("triggers", 0, "authenticationRef"), {"name": "prometheus", "kind": "TriggerAuthentication"}),
        ],
    ),
    "cluster-trigger-authentication": (
        {
            "prometheusAuth": {
                "authModes": ["basic"],
                "authenticationRef": {"name": "platform", "kind": "ClusterTriggerAuthentication"},
            }
        },
        [(("triggers", 0, "authenticationRef", "kind"), "ClusterTriggerAuthentication")],
    ),
    "prometheus-namespace": (
        {"prometheusNamespace": "ml"},
        [(("triggers", 0, "metadata", "namespace"), "ml")],
    ),
    "scale-to-zero": (
        {"minReplicas": 0, "scaleToZero": True, "activationQuery": 'rate(ingress_requests{host="emb"}[2m])'},
        [
            (("minReplicaCount",), 0),
            (("cooldownPeriod",), 300),
            (("triggers", 1, "name"), "held-requests"),
            (("triggers", 1, "metadata", "query"), HELD_QUERY),
            (("triggers", 1, "metadata", "threshold"), "1"),
            (("triggers", 2, "name"), "activation"),
            (("triggers", 2, "metadata", "query"), 'sum(rate(ingress_requests{host="emb"}[2m])) > bool 0'),
            (("triggers", 2, "metadata", "threshold"), "1"),
        ],
    ),
    "scale-to-zero-on-held-requests-alone": (
        {"minReplicas": 0, "scaleToZero": True},
        [
            (("minReplicaCount",), 0),
            (("triggers", 1, "name"), "held-requests"),
            (("triggers", 1, "metadata", "query"), HELD_QUERY),
            (("triggers", 1, "metadata", "threshold"), "1"),
        ],
    ),
}


@pytest.mark.parametrize(("settings", "expected"), SETTINGS.values(), ids=SETTINGS.keys())
def test_each_setting_reaches_the_scaled_object(settings, expected):
    spec = spec_with(ON | settings)
    scaled = a.scaled_object(OWNER, spec, revision_of(spec, IMAGE))
    for path, value in expected:
        node = scaled["spec"]
        for part in path:
            node = node[part]
        assert node == value, path
    assert keda_errors(scaled) == []


def test_without_prometheus_auth_the_triggers_name_no_authentication():
    scaled = a.scaled_object(
        OWNER, spec_with(ON | {"scaleToZero": True, "minReplicas": 0, "activationQuery": "up"}), "r"
    )
    for trigger in scaled["spec"]["triggers"]:
        assert "authenticationRef" not in trigger
        assert {"authModes", "namespace"}.isdisjoint(trigger["metadata"])


def test_both_triggers_query_an_authenticated_prometheus_alike():
    """The activation trigger asks the same Prometheus: it carries the same credentials."""
    auth = {"authModes": ["bearer"], "authenticationRef": {"name": "thanos"}}
    settings = {"scaleToZero": True, "minReplicas": 0, "activationQuery": "up", "prometheusAuth": auth}
    scaled = a.scaled_object(OWNER, spec_with(ON | settings | {"prometheusNamespace": "ml"}), "r")
    queue, held, activation = scaled["spec"]["triggers"]
    assert held["authenticationRef"] == activation["authenticationRef"]
    assert (
        queue["authenticationRef"]
        == activation["authenticationRef"]
        == {
            "name": "thanos",
            "kind": "TriggerAuthentication",
        }
    )
    assert queue["metadata"]["authModes"] == activation["metadata"]["authModes"] == "bearer"
    assert queue["metadata"]["namespace"] == activation["metadata"]["namespace"] == "ml"
    assert keda_errors(scaled) == []


def test_the_queue_query_keeps_exactly_the_revision_pods_of_the_model():
    pattern = re.search(r'pod=~"([^"]+)"', a.queue_query(OWNER, "abcd1234")).group(1)
    is_kept = lambda pod: re.fullmatch(pattern, pod) is not None  # noqa: E731 (PromQL anchors regexes)
    assert is_kept("model-worker-abcd1234-7d9f8c6b5-x2x4z")
    assert not is_kept("model-worker-ffff0000-7d9f8c6b5-x2x4z")  # another revision
    assert not is_kept(
        "model-worker-abcd1234-worker-abcd1234-7d9f8c6b5-x2x4z"
    )  # model "model-worker-abcd1234"
    assert not is_kept("model-gateway-6c5d4b-x2x4z")
    assert 'namespace="ml"' in a.queue_query(OWNER, "abcd1234")


def test_the_fixture_refuses_what_keda_refuses():
    spec = spec_with(ON)
    good = a.scaled_object(OWNER, spec, revision_of(spec, IMAGE))
    bad = {
        "misspelt-field": lambda s: s.update(minReplicas=1),
        "no-triggers": lambda s: s.update(triggers=[]),
        "numeric-threshold": lambda s: s["triggers"][0]["metadata"].update(threshold=8192),
        "window-over-an-hour": lambda s: s["advanced"]["horizontalPodAutoscalerConfig"]["behavior"][
            "scaleDown"
        ].update(stabilizationWindowSeconds=3601),
        "min-above-max": lambda s: s.update(minReplicaCount=5, maxReplicaCount=4),
    }
    for name, breaks in bad.items():
        doc = copy.deepcopy(good)
        breaks(doc["spec"])
        assert keda_errors(doc), name


# --- the gateway's HPA --------------------------------------------------------------------------


def test_the_gateway_hpa_scales_the_gateway_on_cpu_and_is_valid_kubernetes():
    spec = spec_with(gateway_autoscaling={"enabled": True, "minReplicas": 3, "maxReplicas": 12})
    hpa = a.gateway_autoscaler(OWNER, spec)
    assert hpa["spec"]["scaleTargetRef"]["name"] == "model-gateway"
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 12)
    assert hpa["spec"]["metrics"] == [
        {
            "type": "Resource",
            "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}},
        }
    ]
    for version in ("1.31.0", "1.35.0"):
        kubernetes_validate.validate(hpa, version, strict=True)


def render_golden() -> list[dict]:
    spec = spec_with(ON, {"enabled": True})
    zero = spec_with(
        ON | {"minReplicas": 0, "scaleToZero": True, "activationQuery": "indexing_queue_length"},
        base="minilm-cpu.yaml",
    )
    return [
        a.scaled_object(OWNER, spec, revision_of(spec, IMAGE)),
        a.gateway_autoscaler(OWNER, spec),
        a.scaled_object(OWNER, zero, revision_of(zero, IMAGE)),
    ]


def test_autoscalers_match_golden():
    text = yaml.safe_dump_all(render_golden(), sort_keys=False, width=110)
    if os.environ.get("KEMBED_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(text)
    assert GOLDEN.read_text() == text, (
        "rendered autoscalers changed: rerun with KEMBED_UPDATE_GOLDEN=1 and review"
    )


# --- the spec -----------------------------------------------------------------------------------

BAD = {
    "min-zero-without-flag": ({"minReplicas": 0}, "scaleToZero"),
    "flag-without-min-zero": ({"scaleToZero": True, "activationQuery": "x"}, "scaleToZero"),
    "min-above-max": ({"minReplicas": 5, "maxReplicas": 4}, "maxReplicas"),
    "no-prometheus": ({"enabled": True}, "prometheusAddress"),
    "prometheus-not-a-url": (
        {"prometheusAddress": "prometheus:9090"},
        "prometheus_address|prometheusAddress",
    ),
    "target-at-the-queue-cap": ({"targetQueuedTokensPerReplica": 65536}, "maxQueuedTokens"),
    "negative-min": ({"minReplicas": -1}, "min_replicas|minReplicas"),
    "window-over-an-hour": ({"scaleDownStabilizationSeconds": 3601}, "scale_down|scaleDown"),
    "zero-target": ({"targetQueuedTokensPerReplica": 0}, "target_queued|targetQueued"),
}


@pytest.mark.parametrize(("settings", "match"), BAD.values(), ids=BAD.keys())
def test_bad_settings_are_refused(settings, match):
    with pytest.raises(pydantic.ValidationError, match=match):
        spec_with(ON | settings if "enabled" not in settings else settings)


def test_the_gateway_hpa_needs_a_cpu_request_and_min_within_max():
    with pytest.raises(pydantic.ValidationError, match="cpu request"):
        raw = example("bge-m3-gpu.yaml")["spec"]
        raw["gateway"] = {"autoscaling": {"enabled": True}, "resources": {"requests": {"memory": "1Gi"}}}
        parse_spec(raw)
    with pytest.raises(pydantic.ValidationError, match="maxReplicas"):
        spec_with(gateway_autoscaling={"minReplicas": 9})


def test_range_errors_are_in_the_crd_schema_and_cross_field_rules_in_cel():
    body = {"apiVersion": "kembed.dev/v1alpha1", "kind": "EmbeddingModel", "metadata": {"name": "x"}}
    spec = example("minilm-cpu.yaml")["spec"] | {
        "autoscaling": {"maxReplicas": 0, "prometheusAddress": "p:1"}
    }
    found = {
        e.absolute_path[-1] for e in jsonschema.Draft7Validator(CRD_SCHEMA).iter_errors(body | {"spec": spec})
    }
    assert found == {"maxReplicas", "prometheusAddress"}
    rules = " ".join(r["rule"] for r in CEL_RULES["AutoscalingSpec"] + CEL_RULES["EmbeddingModelSpec"])
    for field in ("minReplicas", "maxReplicas", "scaleToZero", "prometheusAddress"):
        assert f"self.{field}" in rules, field
    assert "self.autoscaling.targetQueuedTokensPerReplica < self.worker.maxQueuedTokens" in rules


def test_autoscaling_is_not_part_of_the_revision():
    assert revision_of(spec_with(ON), IMAGE) == revision_of(spec_with(), IMAGE)


def test_an_autoscaled_gateway_follows_the_headless_service_records_too():
    spec = spec_with(ON)
    env = {e["name"]: e.get("value") for e in m.gateway_env(OWNER, spec, "abcd1234")}
    assert "KEMBED_GATEWAY_WORKER_ADDRESSES" not in env
    values = {k: v for k, v in env.items() if v is not None} | {"KEMBED_GATEWAY_MODEL_DIR": "/m"}
    config = parse_gateway_config([], values)
    assert config.worker_service == "model-worker-abcd1234.ml.svc:50051" and config.worker_addresses == ()


def test_a_gateway_of_a_model_at_zero_holds_its_requests_until_a_worker_serves():
    """scaleToZero: the gateway holds requests (its flags, as it parses them), which wakes the model."""
    zero = spec_with(
        ON | {"minReplicas": 0, "scaleToZero": True, "maxHeldRequests": 32, "wakeTimeoutSeconds": 90}
    )
    env = {e["name"]: e.get("value") for e in m.gateway_env(OWNER, zero, "abcd1234")}
    values = {k: v for k, v in env.items() if v is not None} | {"KEMBED_GATEWAY_MODEL_DIR": "/m"}
    config = parse_gateway_config([], values)
    assert (config.max_held_requests, config.wake_timeout_s) == (32, 90.0)
    never_zero = {e["name"] for e in m.gateway_env(OWNER, spec_with(ON), "abcd1234")}
    assert "KEMBED_GATEWAY_MAX_HELD_REQUESTS" not in never_zero  # held nothing: 503 at once, as before


# --- against the fake API -----------------------------------------------------------------------


def merge_patch(live, patch):
    """RFC 7386, what KubeCluster.patch sends: what the patch leaves out keeps its live value."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(live) if isinstance(live, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


class AutoscaledCluster(FakeCluster):
    """The fake API with merge-patch semantics, every write recorded, and an autoscaler to play."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[str, str, str, dict]] = []  # (verb, kind, name, body)

    def create(self, body):
        self.writes.append(("create", body["kind"], body["metadata"]["name"], copy.deepcopy(body)))
        if body["kind"] == "Deployment" and "replicas" not in body["spec"]:  # the API server's default
            body = {**body, "spec": {**body["spec"], "replicas": 1}}
        super().create(body)

    def patch(self, kind, namespace, name, body):
        self.writes.append(("patch", kind, name, copy.deepcopy(body)))
        super().patch(kind, namespace, name, merge_patch(self.objects[(kind, namespace, name)], body))

    def autoscale(self, revision: str, replicas: int) -> None:
        """What KEDA's HPA does: set the Deployment's replicas (its scale subresource); pods follow."""
        (deployment,) = self.named("Deployment", "worker", revision)
        deployment["spec"]["replicas"] = replicas
        self.run_workers(revision, ip_base=20 + replicas)

    def replica_writes(self, kind: str, name: str) -> list[tuple[str, int | None]]:
        return [
            (verb, body["spec"].get("replicas")) for verb, k, n, body in self.writes if (k, n) == (kind, name)
        ]


@pytest.fixture
def driver() -> Driver:
    spec = example("minilm-cpu.yaml")["spec"] | {"autoscaling": ON | {"minReplicas": 2, "maxReplicas": 8}}
    driver = Driver(spec)
    driver.cluster = AutoscaledCluster()
    return driver


def scaled_objects(cluster: FakeCluster) -> dict[str, str]:
    """ScaledObject name -> the Deployment it scales."""
    return {
        o["metadata"]["name"]: o["spec"]["scaleTargetRef"]["name"]
        for o in cluster.named("ScaledObject", "worker")
    }


def test_a_first_rollout_starts_at_min_replicas_then_the_autoscaler_owns_them(driver):
    revision = driver.promote()
    name = f"minilm-worker-{revision}"
    cluster = driver.cluster
    # Created at minReplicas for the gate; once serving, patched without replicas (a merge patch keeps them).
    assert cluster.replica_writes("Deployment", name) == [("create", 2), ("patch", None)]
    assert cluster.objects[("Deployment", "ml", name)]["spec"]["replicas"] == 2
    assert scaled_objects(cluster) == {name: name}
    cluster.autoscale(revision, 5)
    cluster.writes.clear()
    status = driver.step()
    driver.step(60)
    assert cluster.writes == []  # the timer's passes leave the autoscaler's count alone
    assert (status["replicas"], status["readyReplicas"], status["phase"]) == (5, 5, "Ready")
    assert cluster.objects[("Deployment", "ml", name)]["spec"]["replicas"] == 5


def test_a_rollout_under_autoscaling_starts_at_the_current_count_and_the_scaled_object_follows(driver):
    old = driver.promote()
    cluster = driver.cluster
    cluster.autoscale(old, 3)
    driver.edit("worker", maxBatchTokens=1024)
    new = driver.step()["candidateRevision"]
    assert new != old
    assert driver.body["status"]["rollout"]["replicas"] == 3
    assert cluster.objects[("Deployment", "ml", f"minilm-worker-{new}")]["spec"]["replicas"] == 3
    cluster.autoscale(old, 6)  # the serving revision keeps scaling meanwhile; the gated pods stay put
    cluster.run_workers(new)
    assert driver.step()["rollout"]["stage"] == "Prewarming"
    (prewarm,) = cluster.named("Job", "prewarm")
    assert prewarm["spec"]["template"]["spec"]["containers"][0]["command"].count("--target") == 3
    assert cluster.objects[("Deployment", "ml", f"minilm-worker-{old}")]["spec"]["replicas"] == 6
    assert scaled_objects(cluster) == {f"minilm-worker-{old}": f"minilm-worker-{old}"}
    cluster.finish_job("prewarm", True)
    assert driver.step()["rollout"]["stage"] == "SmokeTesting"
    cluster.finish_job("smoke", True)
    assert driver.step()["rollout"]["stage"] == "Promoting"
    cluster.roll_gateway()
    status = driver.step()
    assert status["activeRevision"] == new and status["replicas"] == 3
    assert scaled_objects(cluster) == {f"minilm-worker-{new}": f"minilm-worker-{new}"}
    assert cluster.named("Deployment", "worker", old) == []
    assert cluster.replica_writes("Deployment", f"minilm-worker-{new}") == [("create", 3), ("patch", None)]
    assert all(r is None for verb, r in cluster.replica_writes("Deployment", f"minilm-worker-{old}")[1:])


def test_a_revision_scaled_to_zero_is_still_gated_on_one_pod():
    spec = example("minilm-cpu.yaml")["spec"] | {
        "autoscaling": ON | {"minReplicas": 0, "scaleToZero": True, "activationQuery": "queue_len"}
    }
    driver = Driver(spec)
    driver.cluster = AutoscaledCluster()
    old = driver.promote()
    driver.cluster.autoscale(old, 0)
    assert driver.step()["phase"] == "Degraded"  # no worker serves until held requests wake one
    driver.edit("worker", maxBatchTokens=1024)
    assert driver.step()["rollout"]["replicas"] == 1
    assert driver.promote() != old


def test_turning_autoscaling_off_deletes_the_scaled_object_and_restores_worker_replicas(driver):
    revision = driver.promote()
    driver.cluster.autoscale(revision, 5)
    driver.edit("autoscaling", enabled=False)
    status = driver.step()
    assert scaled_objects(driver.cluster) == {}
    assert driver.cluster.objects[("Deployment", "ml", f"minilm-worker-{revision}")]["spec"]["replicas"] == 1
    assert status["activeRevision"] == revision and status["rollout"] is None  # no rollout


def test_the_gateway_hpa_owns_the_gateway_replicas_and_goes_when_turned_off(driver):
    driver.edit("gateway", autoscaling={"enabled": True, "minReplicas": 2, "maxReplicas": 6})
    driver.promote()
    cluster = driver.cluster
    assert [verb for verb, _ in cluster.replica_writes("HorizontalPodAutoscaler", "minilm-gateway")] == [
        "create"
    ]
    assert {r for _, r in cluster.replica_writes("Deployment", "minilm-gateway")} == {None}
    driver.edit("gateway", autoscaling={"enabled": False})
    driver.step()
    assert ("HorizontalPodAutoscaler", "ml", "minilm-gateway") not in cluster.objects
    assert (
        cluster.objects[("Deployment", "ml", "minilm-gateway")]["spec"]["replicas"] == 1
    )  # gateway.replicas


def test_a_cluster_without_keda_says_so_in_an_autoscaling_condition_and_keeps_serving(driver):
    driver.cluster.unserved.add("ScaledObject")
    revision = driver.promote()
    condition = driver.condition("Autoscaling")
    assert (condition["status"], condition["reason"]) == ("False", "KedaMissing")
    assert "KEDA" in condition["message"]
    assert driver.body["status"]["phase"] == "Ready"  # the workers serve at their count
    driver.cluster.unserved.clear()  # KEDA installed
    driver.step()
    condition = driver.condition("Autoscaling")
    assert (condition["status"], condition["reason"]) == ("True", "ScaledObjectApplied")
    assert scaled_objects(driver.cluster) == {f"minilm-worker-{revision}": f"minilm-worker-{revision}"}
    driver.edit("autoscaling", enabled=False)
    driver.step()
    assert "Autoscaling" not in {c["type"] for c in driver.body["status"]["conditions"]}
