"""A revision changes with what shapes worker pods, and with nothing else."""

from __future__ import annotations

import copy

import pytest
from operator_fakes import example

from kembed.operator.build.revision import revision_of
from kembed.operator.spec.spec import TrafficClassesSpec, parse_spec

BASE = example("bge-m3-gpu.yaml")["spec"]
IMAGE = "registry.test/kembed/worker:1"


def revision_after(section: str, **fields) -> str:
    spec = copy.deepcopy(BASE)
    spec.setdefault(section, {}).update(fields)
    if fields.get("cudaGraphs") is False:  # no graphs, no prewarm list (the CRD's rule); not a revision
        spec["graphs"]["prewarmBuckets"] = []
    return revision_of(parse_spec(spec), IMAGE)


SHAPING = {
    "dtype": ("model", {"dtype": "float16"}),
    "served-name": ("model", {"servedName": "bge"}),
    "backend": ("worker", {"attentionBackend": "sdpa"}),
    "batch-tokens": ("worker", {"maxBatchTokens": 2048}),
    "bucket-sequences": ("worker", {"maxBatchSequences": 64}),
    "cuda-graphs": ("worker", {"cudaGraphs": False}),
    "pinned-cap": ("worker", {"maxPinnedBytes": 1 << 30}),
    "resources": ("worker", {"resources": {"limits": {"nvidia.com/gpu": 2}}}),
    "node-selector": ("worker", {"nodeSelector": {"gpu": "a100"}}),
    "priority-class": ("worker", {"priorityClassName": "kembed-serving"}),
    "hard-spread": ("worker", {"topologySpread": {"nodes": "DoNotSchedule"}}),
    "stall-restart": ("worker", {"stallRestartSeconds": 300}),
    # What decides whether and how a worker runs: what its account is granted, whether the container
    # sees the GPU, a variable the engine reads, who may read the model and write the kernel cache.
    "service-account": ("worker", {"serviceAccountName": "kembed-serving"}),
    "runtime-class": ("worker", {"runtimeClassName": "nvidia"}),
    "env": ("worker", {"env": [{"name": "PYTORCH_CUDA_ALLOC_CONF", "value": "expandable_segments:True"}]}),
    "env-from-secret": (
        "worker",
        {"env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "s", "key": "t"}}}]},
    ),
    "env-from": ("worker", {"envFrom": [{"configMapRef": {"name": "proxy"}}]}),
    "ids-from-the-cluster": ("worker", {"securityContext": {"fixedIds": False}}),
    "uid": ("worker", {"securityContext": {"runAsUser": 1000}}),
    "mig-slice": ("worker", {"resources": {"limits": {"nvidia.com/mig-1g.10gb": 1}}}),
    "classes-off": ("trafficClasses", {"enabled": False}),
    "bulk-queue-share": ("trafficClasses", {"bulkQueueShare": 0.5}),
    "bulk-step-tokens": ("trafficClasses", {"bulkStepTokens": 2048}),
    "interactive-hold": ("trafficClasses", {"interactiveHoldSeconds": 0.25}),
    "bulk-max-wait": ("trafficClasses", {"bulkMaxWaitSeconds": 2}),
    "no-interactive-lane": ("trafficClasses", {"interactiveLane": False}),
    "one-lane-step": ("trafficClasses", {"laneInflightBatches": 1}),
}
NOT_SHAPING = {
    "worker-replicas": ("worker", {"replicas": 7}),
    "gateway-replicas": ("gateway", {"replicas": 5}),
    "chunk-tokens": ("gateway", {"chunkTokens": 1024}),
    "prewarm-buckets": ("graphs", {"prewarmBuckets": ["1x64"]}),
    "startup-prewarm": ("graphs", {"startupPrewarm": "listed", "prewarmSeconds": 30}),
    "min-cosine": ("rollout", {"minCosine": 0.99}),
    "interactive-inputs": ("trafficClasses", {"interactiveMaxInputs": 4}),
    "interactive-lane-at-its-default": ("trafficClasses", {"interactiveLane": True}),
    "lane-steps-at-their-default": ("trafficClasses", {"laneInflightBatches": 2}),
    "interactive-tokens": ("trafficClasses", {"interactiveMaxTokens": 512}),
    "bulk-tokenization-processes": ("trafficClasses", {"bulkTokenizationProcesses": 2}),
    "bulk-gateway": ("trafficClasses", {"bulkGateway": {"replicas": 3}}),
    "monitor-labels": ("metrics", {"labels": {"release": "prometheus"}}),
    "worker-budget": ("worker", {"disruptionBudget": {"minAvailable": 1}}),
    "gateway-budget": ("gateway", {"disruptionBudget": {"enabled": False}}),
    "gateway-priority": ("gateway", {"priorityClassName": "kembed-serving"}),
    "gateway-spread": ("gateway", {"topologySpread": {"zones": "Off"}}),
    "gateway-processes": ("gateway", {"processes": 4}),
    "network-policy": ("networkPolicy", {"enabled": False, "metricsNamespaces": ["monitoring"]}),
    # How a pod is pulled or filed, not what it computes: rolled in place, no gates (revision.py).
    "pull-secrets": ("worker", {"imagePullSecrets": [{"name": "registry"}]}),
    "pod-labels": ("worker", {"podLabels": {"team": "search"}}),
    "pod-annotations": ("worker", {"podAnnotations": {"sidecar.istio.io/inject": "false"}}),
    "gateway-env": ("gateway", {"env": [{"name": "KEMBED_GATEWAY_LOG_LEVEL", "value": "DEBUG"}]}),
    "gateway-account": ("gateway", {"serviceAccountName": "edge", "runtimeClassName": "gvisor"}),
    "gateway-placement": (
        "gateway",
        {"nodeSelector": {"pool": "cpu"}, "tolerations": [{"operator": "Exists"}]},
    ),
    "gateway-ids": ("gateway", {"securityContext": {"fixedIds": False}}),
    "prometheus-auth": (
        "autoscaling",
        {"prometheusAuth": {"authModes": ["bearer"], "authenticationRef": {"name": "prometheus"}}},
    ),
}


@pytest.mark.parametrize("section,fields", SHAPING.values(), ids=SHAPING.keys())
def test_what_shapes_worker_pods_is_a_new_revision(section, fields):
    assert revision_after(section, **fields) != revision_of(parse_spec(BASE), IMAGE)


@pytest.mark.parametrize("section,fields", NOT_SHAPING.values(), ids=NOT_SHAPING.keys())
def test_scaling_and_serving_settings_are_not_a_revision(section, fields):
    assert revision_after(section, **fields) == revision_of(parse_spec(BASE), IMAGE)


def test_the_image_is_part_of_the_revision():
    spec = parse_spec(BASE)
    assert revision_of(spec, IMAGE) != revision_of(spec, IMAGE + "-patched")
    assert len(revision_of(spec, IMAGE)) == 8


def test_traffic_classes_at_their_defaults_keep_the_revision_of_a_spec_without_them():
    """So that upgrading to an operator that knows trafficClasses rolls no worker out."""
    without = {k: v for k, v in copy.deepcopy(BASE).items() if k != "trafficClasses"}
    defaults = TrafficClassesSpec().model_dump(by_alias=True, mode="json")
    assert revision_of(parse_spec(without | {"trafficClasses": defaults}), IMAGE) == revision_of(
        parse_spec(without), IMAGE
    )


def test_placement_fields_at_their_defaults_keep_the_revision_of_a_spec_without_them():
    """So that upgrading to an operator that knows them rolls no worker out through the gates."""
    spec = copy.deepcopy(BASE)
    spec["worker"] |= {
        "priorityClassName": "",
        "stallRestartSeconds": 60,
        "topologySpread": {"nodes": "ScheduleAnyway", "zones": "ScheduleAnyway", "maxSkew": 1},
        "disruptionBudget": {"enabled": True, "maxUnavailable": 1},
        # the pod settings, as the API server stores them once the CRD defaults them
        "serviceAccountName": "",
        "runtimeClassName": "",
        "env": [],
        "envFrom": [],
        "imagePullSecrets": [],
        "podLabels": {},
        "podAnnotations": {},
        "securityContext": {"fixedIds": True, "runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001},
    }
    assert revision_of(parse_spec(spec), IMAGE) == revision_of(parse_spec(BASE), IMAGE)
