"""The CRD generated from the typed spec: fresh in the chart, described, defaulted like the typed
spec, and refusing bad EmbeddingModels (checked with jsonschema's Draft 7, as the API server's
OpenAPI validation would; CEL rules are checked for naming real fields)."""

from __future__ import annotations

import copy
import re

import jsonschema
import pytest
import yaml
from operator_fakes import EXAMPLES, REPO, example

from kembed.operator.crd import CEL_RULES, POD_SETTINGS_RULES, build_crd, render
from kembed.operator.spec.spec import parse_spec

CRD_FILE = REPO / "charts" / "kembed" / "crds" / "embeddingmodels.kembed.dev.yaml"
SCHEMA = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
EXAMPLE_FILES = sorted(p.name for p in EXAMPLES.glob("*.yaml"))
MINIMAL = {"model": {"source": {"hostPath": {"path": "/models/m"}}}}


def errors(body: dict) -> list[str]:
    return [e.message for e in jsonschema.Draft7Validator(SCHEMA).iter_errors(body)]


def with_defaults(schema: dict, value):
    """What the API server stores: defaults applied top-down, into defaulted objects too."""
    if schema.get("type") == "object" and isinstance(value, dict):
        for key, sub in schema.get("properties", {}).items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                value[key] = with_defaults(sub, value[key])
    return value


def test_the_chart_crd_is_fresh():
    assert CRD_FILE.read_text() == render(), "run: python -m kembed.operator.crd > " + str(CRD_FILE)


@pytest.mark.parametrize("name", EXAMPLE_FILES, ids=EXAMPLE_FILES)
def test_examples_are_valid_embedding_models(name):
    body = example(name)
    assert errors(body) == []
    parse_spec(body["spec"])


BAD_SPECS = {
    "two-sources": (
        {"model": {"source": {"hostPath": {"path": "/m"}, "pvc": {"claimName": "w"}}}},
        "valid under each",
    ),
    "no-source": ({"model": {"source": {}}}, "is not valid under any"),
    "no-model": ({"worker": {"replicas": 1}}, "'model' is a required property"),
    "relative-host-path": ({"model": {"source": {"hostPath": {"path": "models"}}}}, "does not match '^/'"),
    "bad-bucket": ({**MINIMAL, "graphs": {"prewarmBuckets": ["8by512"]}}, "does not match"),
    "negative-replicas": ({**MINIMAL, "worker": {"replicas": -1}}, "less than the minimum"),
    "unknown-dtype": ({"model": {**MINIMAL["model"], "dtype": "int4"}}, "is not one of"),
    "cosine-above-one": ({**MINIMAL, "rollout": {"minCosine": 1.5}}, "greater than the maximum"),
    "bad-service-type": ({**MINIMAL, "gateway": {"service": {"type": "Ingress"}}}, "is not one of"),
    "huge-max-sequence-length": ({"model": {**MINIMAL["model"], "maxSequenceLength": 10**7}}, "greater than"),
    "no-gateway-process": ({**MINIMAL, "gateway": {"processes": 0}}, "less than the minimum"),
    "too-many-bulk-tokenizers": (
        {**MINIMAL, "trafficClasses": {"bulkTokenizationProcesses": 17}},
        "greater than the maximum",
    ),
    "unknown-spread": ({**MINIMAL, "worker": {"topologySpread": {"zones": "Maybe"}}}, "is not one of"),
    "bad-priority-class": ({**MINIMAL, "gateway": {"priorityClassName": "Serving"}}, "does not match"),
    "bad-service-account": ({**MINIMAL, "worker": {"serviceAccountName": "Kembed_SA"}}, "does not match"),
    "bad-runtime-class": ({**MINIMAL, "gateway": {"runtimeClassName": "nvidia runtime"}}, "does not match"),
    "pull-secret-without-name": ({**MINIMAL, "worker": {"imagePullSecrets": [{}]}}, "'name' is a required"),
    "env-without-name": ({**MINIMAL, "gateway": {"env": [{"value": "x"}]}}, "'name' is a required"),
    "env-bad-name": ({**MINIMAL, "worker": {"env": [{"name": "1X=2"}]}}, "does not match"),
    "secret-key-without-key": (
        {**MINIMAL, "worker": {"env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "s"}}}]}},
        "'key' is a required",
    ),
    "label-value-too-long": ({**MINIMAL, "worker": {"podLabels": {"team": "x" * 64}}}, "is too long"),
    "label-value-bad": ({**MINIMAL, "gateway": {"podLabels": {"team": "a b"}}}, "does not match"),
    "root-uid": ({**MINIMAL, "worker": {"securityContext": {"runAsUser": 0}}}, "less than the minimum"),
    "unknown-auth-mode": (
        {
            **MINIMAL,
            "autoscaling": {"prometheusAuth": {"authModes": ["oauth"], "authenticationRef": {"name": "a"}}},
        },
        "is not one of",
    ),
    "auth-without-ref": (
        {**MINIMAL, "autoscaling": {"prometheusAuth": {"authModes": ["bearer"]}}},
        "required",
    ),
    "auth-without-modes": (
        {**MINIMAL, "autoscaling": {"prometheusAuth": {"authModes": [], "authenticationRef": {"name": "a"}}}},
        "should be non-empty",
    ),
}


@pytest.mark.parametrize("spec,expected", BAD_SPECS.values(), ids=BAD_SPECS.keys())
def test_bad_specs_are_refused(spec, expected):
    body = {
        "apiVersion": "kembed.dev/v1alpha1",
        "kind": "EmbeddingModel",
        "metadata": {"name": "x"},
        "spec": spec,
    }
    found = errors(body)
    assert any(expected in e for e in found), found


def test_schema_defaults_agree_with_the_typed_spec():
    stored = with_defaults(SCHEMA["properties"]["spec"], copy.deepcopy(MINIMAL))
    assert parse_spec(stored) == parse_spec(MINIMAL)
    assert stored["worker"]["resources"]["limits"]["nvidia.com/gpu"] == 1


def _walk(schema: dict, path: str):
    yield path, schema
    for key, sub in schema.get("properties", {}).items():
        yield from _walk(sub, f"{path}.{key}")
    if isinstance(schema.get("items"), dict):
        yield from _walk(schema["items"], f"{path}[]")


def test_every_spec_and_status_field_is_described():
    undescribed = [
        path
        for part in ("spec", "status")
        for path, node in _walk(SCHEMA["properties"][part], part)
        if "description" not in node and not path.endswith("[]")
    ]
    assert undescribed == []


def test_cel_rules_name_fields_that_exist():
    spec = SCHEMA["properties"]["spec"]["properties"]
    peer = spec["networkPolicy"]["properties"]["gatewayFrom"]["items"]
    by_class = {
        "ModelSource": spec["model"]["properties"]["source"],
        "ModelSpec": spec["model"],
        "WorkerSpec": SCHEMA["properties"]["spec"]["properties"]["worker"],
        "DisruptionBudgetSpec": spec["worker"]["properties"]["disruptionBudget"],
        "NetworkPeer": peer,
        "LabelSelectorRequirement": peer["properties"]["podSelector"]["properties"]["matchExpressions"][
            "items"
        ],
        "EmbeddingModelSpec": SCHEMA["properties"]["spec"],
        "AutoscalingSpec": SCHEMA["properties"]["spec"]["properties"]["autoscaling"],
        "GatewaySpec": SCHEMA["properties"]["spec"]["properties"]["gateway"],
        "TrafficClassesSpec": spec["trafficClasses"],
        "GatewayAutoscalingSpec": SCHEMA["properties"]["spec"]["properties"]["gateway"]["properties"][
            "autoscaling"
        ],
        "EnvVar": spec["worker"]["properties"]["env"]["items"],
        "EnvVarSource": spec["worker"]["properties"]["env"]["items"]["properties"]["valueFrom"],
        "EnvFromSource": spec["worker"]["properties"]["envFrom"]["items"],
        "PodSecuritySpec": spec["worker"]["properties"]["securityContext"],
        "HuggingFaceSource": spec["model"]["properties"]["source"]["properties"]["huggingFace"],
        "S3Source": spec["model"]["properties"]["source"]["properties"]["s3"],
    }
    for pod_rule in POD_SETTINGS_RULES:  # the pod settings' rules are on both components
        assert pod_rule in spec["worker"]["x-kubernetes-validations"]
        assert pod_rule in spec["gateway"]["x-kubernetes-validations"]
    for field in ("env", "envFrom", "securityContext"):  # and so are their types'
        assert spec["gateway"]["properties"][field] == spec["worker"]["properties"][field] | {
            "description": spec["gateway"]["properties"][field]["description"]
        }
    assert (
        spec["gateway"]["properties"]["disruptionBudget"]["x-kubernetes-validations"]
        == (CEL_RULES["DisruptionBudgetSpec"])
    )
    for name, rules in CEL_RULES.items():
        assert by_class[name]["x-kubernetes-validations"] == rules
        for rule in rules:
            # a field chain, less a method called on it (self.maxUnavailable.matches(...))
            for chain in re.findall(
                r"self((?:\.[A-Za-z][A-Za-z0-9]*)+?)(?=\.[A-Za-z]+\(|[^.A-Za-z0-9(]|$)", rule["rule"]
            ):
                node = by_class[name]
                for part in chain.strip(".").split("."):
                    assert part in node["properties"], f"{name}: {rule['rule']} names {part}"
                    node = node["properties"][part]


def test_printer_columns_and_subresources():
    version = build_crd()["spec"]["versions"][0]
    assert [c["name"] for c in version["additionalPrinterColumns"]][:3] == ["Phase", "Active", "Ready"]
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.worker.replicas"
    assert build_crd()["spec"]["names"]["shortNames"] == ["em"]
    assert yaml.safe_load(CRD_FILE.read_text())["metadata"]["name"] == "embeddingmodels.kembed.dev"
