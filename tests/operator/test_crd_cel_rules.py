"""The CRD's CEL rules, evaluated as the API server would on create (cel_admission.py: structural
defaults first, then each rule at its node): every example in the chart is admitted with no rule
failing or erroring; each rule refuses what its message says, and only that rule; and the operator's
typed spec refuses each of those too, so a cluster that does not evaluate the rules (or a model
stored before the CRD gained one) still gets a clear refusal in the model's status."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from cel_admission import admit, schema

from kembed.operator.cluster.reconcile import InvalidSpec, typed_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "charts/kembed/examples"
SCHEMA = schema()


def base() -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES / "minilm-cpu.yaml").read_text())


def rules_in(node: dict[str, Any]) -> list[str]:
    """Every rule in the schema below `node`, its own first."""
    children = [*(node.get("properties") or {}).values(), *([node["items"]] if "items" in node else [])]
    own = [rule["rule"] for rule in node.get("x-kubernetes-validations", [])]
    return own + [rule for child in children for rule in rules_in(child)]


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_is_admitted(path):
    verdicts = admit(yaml.safe_load(path.read_text()), SCHEMA)
    assert verdicts, "no rule was evaluated"
    assert [v for v in verdicts if v.outcome != "passed"] == []


def test_a_spec_of_only_a_model_source_is_admitted():
    """Rules on spec name worker, gateway, graphs, trafficClasses and autoscaling fields: the CRD's
    defaults must fill them in, or the API server refuses the smallest model with a CEL error."""
    body = {
        "apiVersion": "kembed.dev/v1alpha1",
        "kind": "EmbeddingModel",
        "metadata": {"name": "m"},
        "spec": {"model": {"source": {"pvc": {"claimName": "models"}}}},
    }
    verdicts = admit(body, SCHEMA)
    assert [v for v in verdicts if v.outcome != "passed"] == []
    assert len(verdicts) >= 20


def set_in(body: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node = body
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def edits(*pairs: tuple[str, Any]) -> Callable[[dict[str, Any]], None]:
    def apply(body: dict[str, Any]) -> None:
        for dotted, value in pairs:
            set_in(body, dotted, value)

    return apply


def drop_limits(body: dict[str, Any]) -> None:
    body["spec"]["worker"]["device"] = "cuda"
    body["spec"]["worker"]["resources"]["limits"] = {"memory": "2Gi"}


def two_sources(body: dict[str, Any]) -> None:
    body["spec"]["model"]["source"]["pvc"] = {"claimName": "models"}


def no_source(body: dict[str, Any]) -> None:
    body["spec"]["model"]["source"] = {}


PEER_SELECTOR = {"matchLabels": {"team": "search"}}
FIELD_REF = {"fieldRef": {"fieldPath": "metadata.name"}}
SECRET_KEY = {"secretKeyRef": {"name": "s", "key": "k"}}
AUTOSCALING = {"enabled": True, "prometheusAddress": "http://prometheus:9090"}

# (id, the edit to the CPU example, a part of the refusing rule's message)
CLASSES = "spec.trafficClasses"
PEERS = "spec.networkPolicy.gatewayFrom"
SCALING = "spec.autoscaling"
GPU = ("spec.worker.resources.limits", {"nvidia.com/gpu": 1})


def expression(operator: str, values: list[str]) -> dict[str, Any]:
    return {"matchExpressions": [{"key": "team", "operator": operator, "values": values}]}


# (id, the edit to the CPU example, a part of the refusing rule's message)
REFUSED = [
    ("name-too-long", edits(("metadata.name", "m" * 41)), "at most 40 characters"),
    ("fp8-on-cpu", edits(("spec.model.linearDtype", "fp8")), "needs fp8 tensor cores"),
    ("chunk-over-queue",
     edits(("spec.gateway.chunkTokens", 70000), ("spec.worker.maxQueuedTokens", 65536)),
     "chunkTokens must not exceed"),
    ("prewarm-without-graphs", edits(("spec.graphs.prewarmBuckets", ["8x512"])), "needs worker.cudaGraphs"),
    ("bulk-step-over-budget",
     edits((f"{CLASSES}.bulkStepTokens", 4096), ("spec.worker.maxBatchTokens", 2048)),
     "bulkStepTokens must not exceed"),
    ("autoscaling-target-over-queue",
     edits((SCALING, {**AUTOSCALING, "targetQueuedTokensPerReplica": 65536}),
           ("spec.worker.maxQueuedTokens", 65536)),
     "must be below worker.maxQueue"),
    ("fp8-with-float16",
     edits(("spec.model.linearDtype", "fp8"), ("spec.model.dtype", "float16"),
           ("spec.worker.device", "cuda"), GPU),
     "dtype must be"),
    ("two-model-sources", two_sources, "exactly one model source"),
    ("no-model-source", no_source, "exactly one model source"),
    ("hub-and-pvc", edits(("spec.model.source.huggingFace", {"repo": "BAAI/bge-m3"})),
     "exactly one model source"),
    ("hub-pickles",
     edits(("spec.model.source",
            {"huggingFace": {"repo": "BAAI/bge-m3", "files": ["*.json", "pytorch_model.BIN"]}})),
     "pickled weights"),
    ("s3-pickles", edits(("spec.model.source", {"s3": {"bucket": "models", "files": ["model.pt"]}})),
     "pickled weights"),
    ("cache-for-a-pvc", edits(("spec.model.cache", {"claimName": "cache"})), "a mounted source needs none"),
    ("batch-over-queue",
     edits(("spec.worker.maxBatchTokens", 8192), ("spec.worker.maxQueuedTokens", 4096),
           ("spec.gateway.chunkTokens", 4096)),
     "maxBatchTokens must not exceed"),
    ("cuda-without-gpu-limit", drop_limits, "needs a GPU limit"),
    ("worker-env-sets-an-operator-variable",
     edits(("spec.worker.env", [{"name": "KEMBED_WORKER_PORT", "value": "1"}])),
     "a variable the operator sets itself"),
    ("gateway-env-sets-home", edits(("spec.gateway.env", [{"name": "HOME", "value": "/"}])),
     "a variable the operator sets itself"),
    ("env-value-and-value-from",
     edits(("spec.worker.env", [{"name": "POD", "value": "x", "valueFrom": FIELD_REF}])),
     "a value or a valueFrom"),
    ("env-two-sources",
     edits(("spec.gateway.env", [{"name": "K", "valueFrom": {**FIELD_REF, **SECRET_KEY}}])),
     "exactly one of secretKeyRef"),
    ("env-no-source", edits(("spec.worker.env", [{"name": "K", "valueFrom": {}}])),
     "exactly one of secretKeyRef"),
    ("env-from-both",
     edits(("spec.worker.envFrom", [{"configMapRef": {"name": "a"}, "secretRef": {"name": "b"}}])),
     "a configMapRef or a secretRef"),
    ("env-from-neither", edits(("spec.gateway.envFrom", [{"prefix": "X_"}])),
     "a configMapRef or a secretRef"),
    ("pod-label-of-the-operator",
     edits(("spec.worker.podLabels", {"app.kubernetes.io/component": "x"})), "podLabels: each key"),
    ("pod-label-kembed-prefix", edits(("spec.gateway.podLabels", {"kembed.dev/model": "x"})),
     "podLabels: each key"),
    ("pod-label-bad-key", edits(("spec.gateway.podLabels", {"team name": "search"})), "podLabels: each key"),
    ("pod-annotation-kembed-prefix",
     edits(("spec.worker.podAnnotations", {"kembed.dev/revision": "x"})), "podAnnotations: each key"),
    ("pod-annotation-bad-key", edits(("spec.gateway.podAnnotations", {"/x": "y"})),
     "podAnnotations: each key"),
    ("uid-with-ids-from-the-cluster",
     edits(("spec.worker.securityContext", {"fixedIds": False, "runAsUser": 1000})),
     "set only with fixedIds"),
    ("fs-group-with-ids-from-the-cluster",
     edits(("spec.gateway.securityContext", {"fixedIds": False, "fsGroup": 0})),
     "set only with fixedIds"),
    ("worker-budget-word",
     edits(("spec.worker.disruptionBudget", {"maxUnavailable": "25 percent"})),
     "maxUnavailable is a count or a percentage"),
    ("gateway-budget-min-word",
     edits(("spec.gateway.disruptionBudget", {"minAvailable": "most"})),
     "minAvailable is a count or a percentage"),
    ("gateway-autoscaling-without-cpu-request",
     edits(("spec.gateway.autoscaling", {"enabled": True}),
           ("spec.gateway.resources.requests", {"memory": "1Gi"})),
     "needs a cpu request"),
    ("gateway-autoscaling-min-over-max",
     edits(("spec.gateway.autoscaling", {"minReplicas": 5, "maxReplicas": 2})),
     "minReplicas must not exceed maxReplicas"),
    ("tokenization-processes-with-classes-off",
     edits((CLASSES, {"enabled": False, "bulkTokenizationProcesses": 2})),
     "bulkTokenizationProcesses needs enabled"),
    ("bulk-gateway-with-classes-off",
     edits((CLASSES, {"enabled": False, "bulkGateway": {}})),
     "bulkGateway needs enabled"),
    ("peer-ip-block-and-selector",
     edits((PEERS, [{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": PEER_SELECTOR}])),
     "a peer is either ipBlock"),
    ("peer-empty", edits((PEERS, [{}])), "a peer is either ipBlock"),
    ("in-without-values",
     edits((PEERS, [{"podSelector": expression("In", [])}])),
     "In and NotIn need values"),
    ("exists-with-values",
     edits((PEERS, [{"namespaceSelector": expression("Exists", ["search"])}])),
     "In and NotIn need values"),
    ("autoscaling-min-over-max",
     edits((SCALING, {**AUTOSCALING, "minReplicas": 5, "maxReplicas": 2})),
     "minReplicas must not exceed maxReplicas"),
    ("min-zero-without-scale-to-zero",
     edits((SCALING, {**AUTOSCALING, "minReplicas": 0})),
     "minReplicas 0 needs scaleToZero"),
    ("autoscaling-without-prometheus", edits((SCALING, {"enabled": True})), "needs prometheusAddress"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("edit", "message"), [case[1:] for case in REFUSED], ids=[case[0] for case in REFUSED]
)
def test_each_rule_refuses_what_its_message_says_and_nothing_else_fails(edit, message):
    body = base()
    edit(body)
    verdicts = admit(body, SCHEMA)
    assert [v for v in verdicts if v.outcome.startswith("error")] == []
    refused = [v.message for v in verdicts if v.outcome == "refused"]
    assert len(refused) == 1 and message in refused[0], refused


@pytest.mark.parametrize(("edit", "message"), [case[1:] for case in REFUSED if case[0] != "name-too-long"],
                         ids=[case[0] for case in REFUSED if case[0] != "name-too-long"])  # fmt: skip
def test_the_operator_refuses_what_the_api_server_refuses(edit, message):
    body = base()
    edit(body)
    with pytest.raises(InvalidSpec):
        typed_spec(body)


def test_every_rule_in_the_crd_is_exercised():
    """Each rule appears in a refused case above (or the item rules of both selectors do)."""
    refused_by_case = set()
    for _, edit, _message in REFUSED:
        body = base()
        edit(body)
        refused_by_case |= {v.rule for v in admit(body, SCHEMA) if v.outcome == "refused"}
    assert len(rules_in(SCHEMA)) == 41  # a new rule needs a case here
    assert set(rules_in(SCHEMA)) - refused_by_case == set()


def test_the_valid_forms_of_a_budget_pass():
    for value in (1, "25%", "100%"):
        body = base()
        set_in(body, "spec.worker.disruptionBudget", {"maxUnavailable": value, "minAvailable": value})
        assert [v for v in admit(body, SCHEMA) if v.outcome != "passed"] == []


POD_SETTINGS = {
    "imagePullSecrets": [{"name": "registry"}],
    "serviceAccountName": "kembed-serving",
    "runtimeClassName": "nvidia",
    "env": [
        {"name": "KEMBED_WORKER_LOG_LEVEL", "value": "DEBUG"},  # a flag the CRD does not carry
        {"name": "POD_NAME", "valueFrom": FIELD_REF},
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token", "optional": True}}},
        {"name": "EMPTY", "value": ""},
    ],
    "envFrom": [{"configMapRef": {"name": "proxy"}}, {"secretRef": {"name": "s"}, "prefix": "S_"}],
    "podLabels": {"team": "search", "example.com/cost-center": "a-1", "app.kubernetes.io/version": "1"},
    "podAnnotations": {"sidecar.istio.io/inject": "false"},
    "nodeSelector": {"pool": "cpu"},
    "securityContext": {"fixedIds": False},
}


@pytest.mark.parametrize("component", ["worker", "gateway"])
def test_the_valid_pod_settings_pass(component):
    body = base()
    body["spec"][component] |= POD_SETTINGS
    assert [v for v in admit(body, SCHEMA) if v.outcome != "passed"] == []
    typed_spec(body)


@pytest.mark.parametrize("limit", ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"])
def test_cuda_on_a_whole_gpu_or_a_mig_slice_passes(limit):
    body = base()
    body["spec"]["worker"] |= {"device": "cuda", "cudaGraphs": True}
    body["spec"]["worker"]["resources"]["limits"] = {"memory": "16Gi", limit: 1}
    assert [v for v in admit(body, SCHEMA) if v.outcome != "passed"] == []
    typed_spec(body)
