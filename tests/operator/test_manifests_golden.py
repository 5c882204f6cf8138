"""Rendered manifests: equal to the golden files (KEMBED_UPDATE_GOLDEN=1 rewrites them), valid for
Kubernetes 1.31 and 1.35 (kubernetes-validate, strict), owned, labelled and locked down."""

from __future__ import annotations

import os

import kubernetes_validate
import pytest
import yaml
from operator_fakes import example

from kembed.operator.build import jobs as j
from kembed.operator.build import manifests as m
from kembed.operator.build import policies as p
from kembed.operator.build.naming import Owner
from kembed.operator.build.revision import revision_of
from kembed.operator.spec.spec import parse_spec

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")
EXAMPLES = ["minilm-cpu.yaml", "bge-m3-gpu.yaml", "platform-gpu.yaml"]
IMAGE = "registry.test/kembed/worker:1"
OWNER = Owner("model", "ml", "0b8c1f8e-0000-4000-8000-000000000001")


def render(example_name: str) -> list[dict]:
    spec = parse_spec(example(example_name)["spec"])
    rev = revision_of(spec, IMAGE)
    targets = ("10.0.0.1:50051", "10.0.0.2:50051")
    objects = [
        m.engine_config_map(OWNER, spec, rev),
        m.worker_deployment(OWNER, spec, rev, IMAGE),
        m.worker_service(OWNER, spec, rev),
        m.gateway_deployment(OWNER, spec, rev, "registry.test/kembed/gateway:1"),
        m.gateway_service(OWNER, spec),
        j.job(OWNER, spec, j.JobRequest("prewarm", rev, 1, targets, ("10.0.9.1:50051",)), IMAGE),
        j.job(OWNER, spec, j.JobRequest("smoke", rev, 1, targets), IMAGE),
    ]
    if spec.metrics.service_monitor:
        objects.append(m.service_monitor(OWNER, spec))
        objects.append(m.worker_pod_monitor(OWNER, spec))
    return objects + p.disruption_budgets(OWNER, spec, [rev]) + p.network_policies(OWNER, spec)


@pytest.mark.parametrize("name", EXAMPLES, ids=EXAMPLES)
def test_manifests_match_golden(name):
    text = yaml.safe_dump_all(render(name), sort_keys=False, width=110)
    path = os.path.join(GOLDEN, name)
    if os.environ.get("KEMBED_UPDATE_GOLDEN") == "1":
        with open(path, "w") as out:
            out.write(text)
    with open(path) as golden:
        assert golden.read() == text, (
            "rendered manifests changed: rerun with KEMBED_UPDATE_GOLDEN=1 and review"
        )


@pytest.mark.parametrize("version", ["1.31.0", "1.35.0"])
@pytest.mark.parametrize("name", EXAMPLES, ids=EXAMPLES)
def test_manifests_are_valid_kubernetes(name, version):
    for doc in render(name):
        if doc["apiVersion"].startswith("monitoring.coreos.com"):
            continue  # a custom kind: kubernetes-validate has no schema for it
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("name", EXAMPLES, ids=EXAMPLES)
def test_every_object_is_owned_and_labelled(name):
    for doc in render(name):
        meta = doc["metadata"]
        assert meta["ownerReferences"] == [OWNER.reference()]
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "kembed-operator"
        assert meta["labels"]["app.kubernetes.io/instance"] == OWNER.name


@pytest.mark.parametrize("name", EXAMPLES, ids=EXAMPLES)
def test_pods_run_non_root_on_a_read_only_root_without_capabilities(name):
    for doc in render(name):
        if doc["kind"] not in ("Deployment", "Job"):
            continue
        pod = doc["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["enableServiceLinks"] is False
        for container in pod["containers"]:
            security = container["securityContext"]
            assert security["readOnlyRootFilesystem"] is True
            assert security["capabilities"] == {"drop": ["ALL"]}
            assert security["allowPrivilegeEscalation"] is False


def test_the_gateway_follows_the_revision_headless_service_records():
    spec = parse_spec(example("bge-m3-gpu.yaml")["spec"])
    rev = revision_of(spec, IMAGE)
    gateway = m.gateway_deployment(OWNER, spec, rev, "gw")
    env = {e["name"]: e.get("value") for e in gateway["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["KEMBED_GATEWAY_WORKER_SERVICE"] == f"model-worker-{rev}.ml.svc:50051"
    assert "KEMBED_GATEWAY_WORKER_ADDRESSES" not in env  # replicas are found, not counted
    assert m.worker_service(OWNER, spec, rev)["spec"]["clusterIP"] == "None"
    assert gateway["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}


def test_a_verdict_fails_the_job_at_once_and_unreachable_workers_are_retried():
    spec = parse_spec(example("minilm-cpu.yaml")["spec"])
    job = j.job(OWNER, spec, j.JobRequest("smoke", "abc", 1, ("10.0.0.1:50051",)), IMAGE)
    (rule,) = job["spec"]["podFailurePolicy"]["rules"]
    assert rule["action"] == "FailJob" and rule["onExitCodes"]["values"] == [1]
    assert job["spec"]["backoffLimit"] == 2
    assert job["spec"]["activeDeadlineSeconds"] == spec.rollout.smoke_timeout_seconds
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command == [
        "kembed-worker",
        "smoke",
        "--target",
        "10.0.0.1:50051",
        "--buckets",
        "1x128,8x512",
        "--min-cosine",
        "0.999",
        "--timeout",
        "600",
    ]


def test_a_golden_config_map_is_mounted_and_checked_by_the_smoke_job():
    raw = example("minilm-cpu.yaml")["spec"]
    raw.setdefault("rollout", {})["goldenConfigMap"] = "minilm-golden"
    spec = parse_spec(raw)
    job = j.job(OWNER, spec, j.JobRequest("smoke", "abc", 1, ("10.0.0.1:50051",)), IMAGE)
    pod = job["spec"]["template"]["spec"]
    command = pod["containers"][0]["command"]
    assert command[command.index("--golden") + 1] == j.GOLDEN_MOUNT
    assert {"name": "golden", "configMap": {"name": "minilm-golden"}} in pod["volumes"]
    prewarm = j.job(OWNER, spec, j.JobRequest("prewarm", "abc", 1, ("10.0.0.1:50051",)), IMAGE)
    assert "--golden" not in prewarm["spec"]["template"]["spec"]["containers"][0]["command"]


def test_monitors_carry_the_labels_prometheus_selects_by_and_ours_win():
    spec_dict = example("bge-m3-gpu.yaml")["spec"]
    spec_dict["metrics"]["labels"] = {"release": "kps", "app.kubernetes.io/component": "spoofed"}
    spec = parse_spec(spec_dict)
    for monitor in (m.service_monitor(OWNER, spec), m.worker_pod_monitor(OWNER, spec)):
        labels = monitor["metadata"]["labels"]
        assert labels["release"] == "kps"
        assert labels["app.kubernetes.io/component"] in ("gateway", "worker")


@pytest.mark.parametrize(
    ("graphs", "expected"),
    [
        ({}, {"KEMBED_WORKER_PREWARM": "all", "KEMBED_WORKER_PREWARM_SECONDS": "120"}),
        (
            {"prewarmBuckets": ["8x512", "1x64"], "prewarmSeconds": 300},
            {
                "KEMBED_WORKER_PREWARM": "all",
                "KEMBED_WORKER_PREWARM_HOT": "8x512,1x64",
                "KEMBED_WORKER_PREWARM_SECONDS": "300",
            },
        ),
        (
            {"prewarmBuckets": ["8x512", "1x64"], "startupPrewarm": "listed"},
            {"KEMBED_WORKER_PREWARM": "8x512,1x64", "KEMBED_WORKER_PREWARM_SECONDS": "120"},
        ),
        (
            {"startupPrewarm": "listed"},
            {"KEMBED_WORKER_PREWARM": "none", "KEMBED_WORKER_PREWARM_SECONDS": "120"},
        ),
        (
            {"prewarmBuckets": ["8x512"], "startupPrewarm": "none"},
            {"KEMBED_WORKER_PREWARM": "none", "KEMBED_WORKER_PREWARM_SECONDS": "120"},
        ),
    ],
    ids=["default-all", "all-hot-first", "listed", "listed-nothing", "none"],
)
def test_worker_pods_prewarm_at_start_as_the_spec_says(graphs, expected):
    spec = parse_spec({**example("bge-m3-gpu.yaml")["spec"], "graphs": graphs})
    env = m.engine_settings(spec, revision_of(spec, IMAGE))
    assert {k: v for k, v in env.items() if k.startswith("KEMBED_WORKER_PREWARM")} == expected
