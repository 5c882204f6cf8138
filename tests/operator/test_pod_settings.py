"""The pod settings of worker and gateway (pod_spec.py): each rendered where a Pod takes it when set and
absent when not, the rollout Jobs following the workers' pull secrets, service account, user and pod
metadata, the operator's own variables and labels kept, and every variant valid Kubernetes. Against
the in-memory API: a pod label rolls the serving workers in place, a variable is a gated revision."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest
from operator_fakes import Driver, example

from kembed.operator.build import jobs as j
from kembed.operator.build import manifests as m
from kembed.operator.build.naming import Owner
from kembed.operator.build.revision import revision_of
from kembed.operator.spec.pod_spec import OPERATOR_ENV
from kembed.operator.spec.spec import EmbeddingModelSpec, parse_spec

OWNER = Owner("model", "ml", "0b8c1f8e-0000-4000-8000-000000000001")
IMAGE = "registry.test/kembed/worker:1"
NEW_POD_KEYS = {"imagePullSecrets", "serviceAccountName", "runtimeClassName"}
SETTINGS: dict[str, Any] = {
    "imagePullSecrets": [{"name": "registry"}, {"name": "mirror"}],
    "serviceAccountName": "kembed-serving",
    "runtimeClassName": "nvidia",
    "env": [
        {"name": "KEMBED_WORKER_LOG_LEVEL", "value": "DEBUG"},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
        {"name": "LIMIT", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
    ],
    "envFrom": [
        {"configMapRef": {"name": "proxy"}},
        {"secretRef": {"name": "s", "optional": True}, "prefix": "S_"},
    ],
    "podLabels": {"team": "search", "example.com/cost-center": "a-1"},
    "podAnnotations": {"sidecar.istio.io/inject": "false"},
    "nodeSelector": {"pool": "gpu"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]}
                ]
            }
        }
    },
}
RENDERED_ENV = [
    {"name": "KEMBED_WORKER_LOG_LEVEL", "value": "DEBUG"},
    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
    {"name": "LIMIT", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
]
RENDERED_ENV_FROM = [
    {"configMapRef": {"name": "proxy"}},
    {"secretRef": {"name": "s", "optional": True}, "prefix": "S_"},
]


def spec_with(
    worker: dict | None = None, gateway: dict | None = None, base="bge-m3-gpu.yaml"
) -> EmbeddingModelSpec:
    raw = copy.deepcopy(example(base)["spec"])
    raw["worker"] |= worker or {}
    raw.setdefault("gateway", {}).update(gateway or {})
    return parse_spec(raw)


def pods(spec: EmbeddingModelSpec) -> dict[str, dict]:
    """The pod templates of the worker Deployment, the gateway Deployment and both rollout Jobs."""
    rev = revision_of(spec, IMAGE)
    request = j.JobRequest("prewarm", rev, 1, ("10.0.0.1:50051",))
    smoke = j.JobRequest("smoke", rev, 1, ("10.0.0.1:50051",))
    return {
        "worker": m.worker_deployment(OWNER, spec, rev, IMAGE)["spec"]["template"],
        "gateway": m.gateway_deployment(OWNER, spec, rev, "gw:1")["spec"]["template"],
        "prewarm": j.job(OWNER, spec, request, IMAGE)["spec"]["template"],
        "smoke": j.job(OWNER, spec, smoke, IMAGE)["spec"]["template"],
    }


def test_unset_pod_settings_render_nothing_new():
    for name, template in pods(spec_with()).items():
        pod = template["spec"]
        assert NEW_POD_KEYS.isdisjoint(pod), name
        assert pod["securityContext"] == {
            "runAsNonRoot": True,
            "runAsUser": 10001,
            "runAsGroup": 10001,
            "fsGroup": 10001,
            "seccompProfile": {"type": "RuntimeDefault"},
        }
        assert "envFrom" not in pod["containers"][0] or name == "worker"
    worker = pods(spec_with())["worker"]
    assert "annotations" not in worker["metadata"]
    assert len(worker["spec"]["containers"][0]["envFrom"]) == 1  # the engine ConfigMap alone


@pytest.mark.parametrize("component", ["worker", "gateway"])
def test_each_setting_lands_where_a_pod_takes_it(component):
    spec = spec_with(**{component: SETTINGS})
    template = pods(spec)[component]
    pod, (container,) = template["spec"], template["spec"]["containers"]
    assert pod["imagePullSecrets"] == [{"name": "registry"}, {"name": "mirror"}]
    assert pod["serviceAccountName"] == "kembed-serving"
    assert pod["automountServiceAccountToken"] is False  # the pods never call the API server
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["nodeSelector"] == {"pool": "gpu"}
    assert pod["tolerations"] == SETTINGS["tolerations"]
    assert pod["affinity"] == SETTINGS["affinity"]
    assert container["env"][-len(RENDERED_ENV) :] == RENDERED_ENV  # after the operator's own
    assert container["envFrom"][: len(RENDERED_ENV_FROM)] == RENDERED_ENV_FROM  # before its ConfigMap
    assert template["metadata"]["labels"]["team"] == "search"
    assert template["metadata"]["labels"]["example.com/cost-center"] == "a-1"
    assert template["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"


def test_the_gateway_keeps_its_revision_annotation_beside_the_spec_s():
    template = pods(spec_with(gateway={"podAnnotations": {"a.example.com/x": "1"}}))["gateway"]
    assert set(template["metadata"]["annotations"]) == {"a.example.com/x", "kembed.dev/revision"}


def test_the_operator_s_configmap_comes_last_among_the_worker_s_env_sources():
    """Of two envFrom sources with a key the later wins: the engine settings beat a user's ConfigMap."""
    (container,) = pods(spec_with(worker=SETTINGS))["worker"]["spec"]["containers"]
    assert container["envFrom"][-1]["configMapRef"]["name"].startswith("model-engine-")


def test_pod_labels_never_move_the_selectors():
    spec = spec_with(worker={"podLabels": {"team": "a"}}, gateway={"podLabels": {"team": "a"}})
    rev = revision_of(spec, IMAGE)
    for deployment in (
        m.worker_deployment(OWNER, spec, rev, IMAGE),
        m.gateway_deployment(OWNER, spec, rev, "g"),
    ):
        selector = deployment["spec"]["selector"]["matchLabels"]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items()
        assert deployment["metadata"]["labels"].get("team") is None  # pod labels, not the Deployment's


def test_the_jobs_follow_the_workers_pull_secrets_account_user_and_metadata():
    spec = spec_with(worker=SETTINGS | {"securityContext": {"fixedIds": False}})
    for name in ("prewarm", "smoke"):
        template = pods(spec)[name]
        pod = template["spec"]
        assert pod["imagePullSecrets"] == [{"name": "registry"}, {"name": "mirror"}]
        assert pod["serviceAccountName"] == "kembed-serving"
        assert "runAsUser" not in pod["securityContext"]
        assert template["metadata"]["labels"]["team"] == "search"
        assert template["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false"}
        # A gRPC client: no GPU runtime, no placement but the workers' tolerations (a cluster of
        # tainted GPU nodes only), none of the workers' variables.
        assert {"runtimeClassName", "nodeSelector", "affinity"}.isdisjoint(pod)
        assert pod["tolerations"] == SETTINGS["tolerations"]
        assert "POD_NAME" not in {e["name"] for e in pod["containers"][0]["env"]}


def test_the_golden_job_goes_where_the_gateway_goes_as_the_gateway_does():
    """It mounts the model as the gateway does: a hostPath model is on the gateway's nodes, a CSI volume
    may need the gateway's service account."""
    spec = spec_with(worker={"serviceAccountName": "workers"}, gateway=SETTINGS)
    request = j.JobRequest("golden", revision_of(spec, IMAGE), 1, ("10.0.0.1:50051",))
    template = j.job(OWNER, spec, request, IMAGE, "gw:1")["spec"]["template"]
    pod = template["spec"]
    assert pod["containers"][0]["image"] == "gw:1"
    assert pod["serviceAccountName"] == "kembed-serving" and pod["nodeSelector"] == {"pool": "gpu"}
    assert pod["tolerations"] == SETTINGS["tolerations"] and pod["affinity"] == SETTINGS["affinity"]
    assert pod["imagePullSecrets"] == [{"name": "registry"}, {"name": "mirror"}]
    assert "runtimeClassName" not in pod and template["metadata"]["labels"]["team"] == "search"
    kubernetes_validate.validate(j.job(OWNER, spec, request, IMAGE, "gw:1"), "1.33.0", strict=True)


def test_the_gateway_s_settings_stay_off_the_jobs():
    for name in ("prewarm", "smoke"):
        assert NEW_POD_KEYS.isdisjoint(pods(spec_with(gateway=SETTINGS))[name]["spec"])


@pytest.mark.parametrize("component", ["worker", "gateway"])
def test_ids_from_the_cluster_set_no_uid_gid_or_fs_group(component):
    """OpenShift's restricted-v2 SCC refuses a UID outside the namespace's range and assigns one."""
    template = pods(spec_with(**{component: {"securityContext": {"fixedIds": False}}}))[component]
    assert template["spec"]["securityContext"] == {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    container = template["spec"]["containers"][0]["securityContext"]
    assert container["runAsNonRoot"] is True and container["allowPrivilegeEscalation"] is False
    assert container["capabilities"] == {"drop": ["ALL"]} and container["readOnlyRootFilesystem"] is True


def test_fixed_ids_can_be_chosen():
    ids = {"runAsUser": 1000, "runAsGroup": 0, "fsGroup": 2000}
    security = pods(spec_with(worker={"securityContext": ids}))["worker"]["spec"]["securityContext"]
    assert {k: security[k] for k in ids} == ids


def test_a_mig_slice_is_the_worker_s_gpu():
    spec = spec_with(worker={"resources": {"limits": {"memory": "16Gi", "nvidia.com/mig-1g.10gb": 1}}})
    (container,) = pods(spec)["worker"]["spec"]["containers"]
    assert container["resources"]["limits"] == {"memory": "16Gi", "nvidia.com/mig-1g.10gb": "1"}


def every_variable_spec() -> EmbeddingModelSpec:
    """A spec that makes the operator render every variable it can."""
    raw = copy.deepcopy(example("bge-m3-gpu.yaml")["spec"])
    raw["model"] |= {"linearDtype": "fp8", "pooling": "cls", "normalize": True, "maxSequenceLength": 512}
    raw["model"]["prompts"] = {"query": "q: "}
    raw["worker"] |= {"authTokenSecretRef": {"name": "t"}, "kernelCacheClaim": "cache"}
    raw["trafficClasses"] |= {
        "interactiveLane": False,
        "laneInflightBatches": 1,
        "bulkTokenizationProcesses": 1,
    }
    raw["graphs"]["startupPrewarm"] = "all"
    raw["gateway"] |= {
        "apiKeySecretRef": {"name": "k"},
        "connections": {
            "maxConnections": 10,
            "headerTimeoutSeconds": 1,
            "bodyTimeoutSeconds": 1,
            "keepAliveTimeoutSeconds": 1,
        },
    }
    return parse_spec(raw)


def test_the_refused_variables_are_exactly_those_the_operator_sets():
    spec = every_variable_spec()
    rev = revision_of(spec, IMAGE)
    names = set(m.engine_settings(spec, rev))
    for template in pods(spec).values():
        names |= {e["name"] for e in template["spec"]["containers"][0]["env"]}
    assert names == set(OPERATOR_ENV)


SETTING_VARIANTS = {
    "unset": {},
    "everything": SETTINGS,
    "ids-from-the-cluster": {"securityContext": {"fixedIds": False}},
    "ids-chosen": {"securityContext": {"runAsUser": 1000, "runAsGroup": 0, "fsGroup": 0}},
}


@pytest.mark.parametrize("version", ["1.31.0", "1.35.0"])
@pytest.mark.parametrize("settings", SETTING_VARIANTS.values(), ids=SETTING_VARIANTS.keys())
def test_every_variant_is_valid_kubernetes(settings, version):
    spec = spec_with(worker=settings, gateway=settings)
    rev = revision_of(spec, IMAGE)
    request = j.JobRequest("prewarm", rev, 1, ("10.0.0.1:50051",))
    for doc in (
        m.worker_deployment(OWNER, spec, rev, IMAGE),
        m.gateway_deployment(OWNER, spec, rev, "gw:1"),
        j.job(OWNER, spec, request, IMAGE),
    ):
        kubernetes_validate.validate(doc, version, strict=True)


def worker_deployments(driver: Driver) -> dict[str, dict]:
    return {
        name: body
        for (kind, _, name), body in driver.cluster.objects.items()
        if kind == "Deployment" and "-worker-" in name
    }


def test_a_pod_label_patches_the_serving_workers_in_place_and_taking_it_out_removes_it():
    driver = Driver(example("minilm-cpu.yaml")["spec"])
    serving = driver.promote()
    driver.edit("worker", podLabels={"team": "search"}, imagePullSecrets=[{"name": "registry"}])
    status = driver.step()
    assert status["activeRevision"] == serving and not status.get("candidateRevision")
    ((name, live),) = worker_deployments(driver).items()
    assert name == f"minilm-worker-{serving}"
    assert live["spec"]["template"]["metadata"]["labels"]["team"] == "search"
    assert live["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "registry"}]
    driver.body["spec"]["worker"].pop("podLabels")
    driver.body["spec"]["worker"].pop("imagePullSecrets")
    driver.body["metadata"]["generation"] += 1
    driver.step()
    live = worker_deployments(driver)[name]
    assert "team" not in live["spec"]["template"]["metadata"]["labels"]
    assert "imagePullSecrets" not in live["spec"]["template"]["spec"]


def test_a_worker_variable_is_a_new_revision_through_the_gates():
    driver = Driver(example("minilm-cpu.yaml")["spec"])
    serving = driver.promote()
    driver.edit("worker", env=[{"name": "KEMBED_WORKER_LOG_LEVEL", "value": "DEBUG"}])
    status = driver.step()
    assert status["activeRevision"] == serving and status["candidateRevision"] not in ("", None, serving)
    serving_pod = worker_deployments(driver)[f"minilm-worker-{serving}"]["spec"]["template"]["spec"]
    assert "KEMBED_WORKER_LOG_LEVEL" not in {e["name"] for e in serving_pod["containers"][0]["env"]}
