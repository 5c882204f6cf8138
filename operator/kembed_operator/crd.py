"""The `embeddingmodels.kembed.dev` CRD, generated from the typed spec and status (`spec.py`,
`model_spec.py`, `pod_spec.py`, `policy_spec.py`, `autoscaling_spec.py`, `traffic_spec.py`,
`edge_spec.py`, `status.py`).

`python -m kembed.operator.crd > charts/kembed/crds/embeddingmodels.kembed.dev.yaml`; a test fails when
the chart's copy is stale. pydantic's JSON schema is turned into a *structural* openAPIV3Schema:
references inlined, `Optional` unwrapped, int-or-string quantities and free-form Pod fields marked,
defaults filled in (including nested objects, so the API server defaults a whole missing section),
and the cross-field rules added as CEL (`x-kubernetes-validations`).
"""

from __future__ import annotations

import sys
from typing import Any

import yaml
from pydantic import BaseModel

from kembed.operator.spec import (
    autoscaling_spec,
    edge_spec,
    model_spec,
    pod_spec,
    policy_spec,
    status,
    traffic_spec,
)
from kembed.operator.spec import spec as s


def _cel_strings(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{value}'" for value in values) + "]"


# The rules of the pod settings both WorkerSpec and GatewaySpec take from pod_spec.PodSettings.
POD_SETTINGS_RULES = [
    {
        "rule": f"self.env.all(e, !(e.name in {_cel_strings(pod_spec.OPERATOR_ENV)}))",
        "message": "env: a variable the operator sets itself (HOME, TMPDIR, KEMBED_REVISION, a kembed "
        "setting it renders from the spec) is refused: set the spec's field instead",
    },
    {
        "rule": f"self.podLabels.all(k, k.matches('{pod_spec.QUALIFIED_NAME}') "
        f"&& !k.startsWith('{pod_spec.OPERATOR_PREFIX}') "
        f"&& !(k in {_cel_strings(pod_spec.OPERATOR_LABELS)}))",
        "message": "podLabels: each key is a label key ([prefix/]name, the name at most 63 characters) "
        "and none of the operator's own (app.kubernetes.io/name, instance, part-of, managed-by, "
        "component; kembed.dev/*)",
    },
    {
        "rule": f"self.podAnnotations.all(k, k.matches('{pod_spec.QUALIFIED_NAME}') "
        f"&& !k.startsWith('{pod_spec.OPERATOR_PREFIX}'))",
        "message": "podAnnotations: each key is an annotation key ([prefix/]name) and not kembed.dev/*",
    },
]
# model_spec.PICKLED_SUFFIXES, as the fetch refuses them.
NO_PICKLES = {
    "rule": "self.files.all(f, !f.matches('(?i)[.](bin|pt|pth|pkl|pickle|ckpt|joblib)$'))",
    "message": "files: pickled weights (.bin, .pt, .pth, .pkl, .ckpt) are refused: they run code when loaded",
}
# Cross-field rules, by model class name. CEL sees camelCase names and the defaults already applied.
CEL_RULES: dict[str, list[dict[str, str]]] = {
    "ModelSource": [
        {
            "rule": "[has(self.pvc), has(self.hostPath), has(self.image), has(self.huggingFace), "
            "has(self.s3)].exists_one(x, x)",
            "message": f"set exactly one model source: {model_spec.SOURCE_NAMES}",
        }
    ],
    "HuggingFaceSource": [NO_PICKLES],
    "S3Source": [NO_PICKLES],
    "ModelSpec": [
        {
            "rule": "!has(self.cache) || has(self.source.huggingFace) || has(self.source.s3)",
            "message": "cache holds what a huggingFace or s3 source fetches; a mounted source needs none",
        },
        {
            "rule": "self.linearDtype != 'fp8' || self.dtype in ['auto', 'bfloat16']",
            "message": "linearDtype fp8 computes in bfloat16 around its GEMMs: dtype must be auto or "
            "bfloat16",
        },
    ],
    "WorkerSpec": [
        {
            "rule": "self.maxBatchTokens <= self.maxQueuedTokens",
            "message": "maxBatchTokens must not exceed maxQueuedTokens: one batch must fit the queue",
        },
        {
            "rule": "self.device != 'cuda' || (has(self.resources.limits) && self.resources.limits.exists("
            f"k, k == '{s.GPU_RESOURCE}' || k.startsWith('{s.MIG_PREFIX}')))",
            "message": s.GPU_LIMIT_MESSAGE,
        },
        *POD_SETTINGS_RULES,
    ],
    "EnvVar": [
        {
            "rule": "!has(self.value) || !has(self.valueFrom)",
            "message": "an env variable has a value or a valueFrom, not both",
        },
    ],
    "EnvVarSource": [
        {
            "rule": "[has(self.secretKeyRef), has(self.configMapKeyRef), has(self.fieldRef), "
            "has(self.resourceFieldRef)].exists_one(x, x)",
            "message": "valueFrom takes exactly one of secretKeyRef, configMapKeyRef, fieldRef, "
            "resourceFieldRef",
        },
    ],
    "EnvFromSource": [
        {
            "rule": "has(self.configMapRef) != has(self.secretRef)",
            "message": "an envFrom entry names a configMapRef or a secretRef: exactly one",
        },
    ],
    "PodSecuritySpec": [
        {
            "rule": f"self.fixedIds || (self.runAsUser == {pod_spec.RUN_AS} && self.runAsGroup == "
            f"{pod_spec.RUN_AS} && self.fsGroup == {pod_spec.RUN_AS})",
            "message": "runAsUser, runAsGroup and fsGroup are set only with fixedIds: true",
        },
    ],
    "DisruptionBudgetSpec": [
        {
            "rule": "type(self.maxUnavailable) == int || self.maxUnavailable.matches('^[0-9]{1,3}%$')",
            "message": "maxUnavailable is a count or a percentage such as '25%'",
        },
        {
            "rule": "!has(self.minAvailable) || type(self.minAvailable) == int "
            "|| self.minAvailable.matches('^[0-9]{1,3}%$')",
            "message": "minAvailable is a count or a percentage such as '75%'",
        },
    ],
    "NetworkPeer": [
        {
            "rule": "has(self.ipBlock) != (has(self.namespaceSelector) || has(self.podSelector))",
            "message": "a peer is either ipBlock or namespaceSelector/podSelector, and one is needed",
        }
    ],
    "LabelSelectorRequirement": [
        {
            "rule": "(self.operator in ['In', 'NotIn']) == (size(self.values) > 0)",
            "message": "In and NotIn need values; Exists and DoesNotExist take none",
        }
    ],
    "EmbeddingModelSpec": [
        {
            "rule": "self.model.linearDtype != 'fp8' || self.worker.device != 'cpu'",
            "message": "model.linearDtype fp8 needs fp8 tensor cores: worker.device must not be cpu",
        },
        {
            "rule": "self.gateway.chunkTokens <= self.worker.maxQueuedTokens",
            "message": "gateway.chunkTokens must not exceed worker.maxQueuedTokens: a larger chunk is "
            "always refused",
        },
        {
            "rule": "self.worker.cudaGraphs || size(self.graphs.prewarmBuckets) == 0",
            "message": "graphs.prewarmBuckets needs worker.cudaGraphs",
        },
        {
            "rule": "self.trafficClasses.bulkStepTokens <= self.worker.maxBatchTokens",
            "message": "trafficClasses.bulkStepTokens must not exceed worker.maxBatchTokens: bulk steps "
            "are part of a batch",
        },
        {
            "rule": "!self.autoscaling.enabled "
            "|| self.autoscaling.targetQueuedTokensPerReplica < self.worker.maxQueuedTokens",
            "message": "autoscaling.targetQueuedTokensPerReplica must be below worker.maxQueuedTokens: a "
            "worker never queues more",
        },
    ],
    "AutoscalingSpec": [
        {
            "rule": "self.minReplicas <= self.maxReplicas",
            "message": "minReplicas must not exceed maxReplicas",
        },
        {
            "rule": "(self.minReplicas == 0) == self.scaleToZero",
            "message": "minReplicas 0 needs scaleToZero: true, and scaleToZero needs minReplicas 0",
        },
        {
            "rule": "!self.enabled || size(self.prometheusAddress) > 0",
            "message": "autoscaling needs prometheusAddress: the Prometheus KEDA queries",
        },
    ],
    "GatewayAutoscalingSpec": [
        {
            "rule": "self.minReplicas <= self.maxReplicas",
            "message": "minReplicas must not exceed maxReplicas",
        },
    ],
    "TrafficClassesSpec": [
        {
            "rule": "self.enabled || self.bulkTokenizationProcesses == 0",
            "message": "bulkTokenizationProcesses needs enabled: with the classes off no request is bulk",
        },
        {
            "rule": "self.enabled || !has(self.bulkGateway)",
            "message": "bulkGateway needs enabled: with the classes off no request is bulk",
        },
    ],
    "GatewaySpec": [
        {
            "rule": "!self.autoscaling.enabled "
            "|| (has(self.resources.requests) && 'cpu' in self.resources.requests)",
            "message": "autoscaling on CPU needs a cpu request in resources.requests: utilisation is a "
            "share of it",
        },
        *POD_SETTINGS_RULES,
    ],
}
# A JSON-schema twin of the one-source rule, so clients that ignore CEL (and the tests) see it too.
ONE_OF: dict[str, list[dict[str, Any]]] = {
    "ModelSource": [{"required": [name]} for name in ("pvc", "hostPath", "image", "huggingFace", "s3")],
}
NAME_RULE = {
    "rule": "size(self.metadata.name) <= 40",
    "message": "name must be at most 40 characters: it prefixes the Deployments, Services and Jobs made "
    "for it",
}

PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {
        "name": "Active",
        "type": "string",
        "jsonPath": ".status.activeRevision",
        "description": "Revision the gateway serves from",
    },
    {
        "name": "Ready",
        "type": "integer",
        "jsonPath": ".status.readyReplicas",
        "description": "Ready workers of the serving revision",
    },
    {"name": "Candidate", "type": "string", "jsonPath": ".status.candidateRevision", "priority": 1},
    {"name": "URL", "type": "string", "jsonPath": ".status.gatewayURL", "priority": 1},
    {"name": "Bulk URL", "type": "string", "jsonPath": ".status.bulkGatewayURL", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def _models() -> dict[str, type[BaseModel]]:
    return {
        name: obj
        for module in (
            s,
            model_spec,
            pod_spec,
            policy_spec,
            autoscaling_spec,
            traffic_spec,
            edge_spec,
            status,
        )
        for name, obj in vars(module).items()
        if isinstance(obj, type) and issubclass(obj, BaseModel) and obj.__module__ == module.__name__
    }


def _default_of(model: type[BaseModel], name: str) -> Any:
    """A field's default as it goes on the wire, or None when it has none worth writing."""
    field = model.model_fields[name]
    if field.is_required():
        return None
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):  # `{}` lets the server default the nested fields one by one
        return value.model_dump(by_alias=True, exclude_defaults=True, mode="json")
    return value


class _Converter:
    def __init__(self, defs: dict[str, Any]) -> None:
        self.defs = defs
        self.models = _models()

    def model(self, name: str) -> dict[str, Any]:
        raw, cls = self.defs[name], self.models[name]
        out: dict[str, Any] = {"type": "object", "description": " ".join(raw["description"].split())}
        by_alias = {f.alias or n: n for n, f in cls.model_fields.items()}
        props = {}
        for alias, prop in raw["properties"].items():
            converted = self.node(prop)
            default = _default_of(cls, by_alias[alias])
            if default is not None:
                converted["default"] = default
            else:
                converted.pop("default", None)
            props[alias] = converted
        out["properties"] = props
        if raw.get("required"):
            out["required"] = raw["required"]
        if name in ONE_OF:
            out["oneOf"] = ONE_OF[name]
        if name in CEL_RULES:
            out["x-kubernetes-validations"] = CEL_RULES[name]
        return out

    def node(self, node: dict[str, Any]) -> dict[str, Any]:
        node = {k: v for k, v in node.items() if k != "title"}
        if "$ref" in node:
            resolved = self.model(node.pop("$ref").rsplit("/", 1)[1])
            if "description" in node:  # the field's description says more than the class's
                resolved["description"] = node["description"]
            return resolved | {k: v for k, v in node.items() if k not in ("description",)}
        if "anyOf" in node:
            options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
            types = sorted(o.get("type", "") for o in options)
            if types == ["integer", "string"]:
                return node | {"x-kubernetes-int-or-string": True}
            assert len(options) == 1, f"unsupported union in the spec: {options}"
            inner = self.node(options[0])
            if "description" in node:
                inner["description"] = node["description"]
            return inner
        is_free_form = "properties" not in node and not isinstance(node.get("additionalProperties"), dict)
        if node.get("type") == "object" and is_free_form:  # a Pod field (affinity, a toleration)
            node.pop("additionalProperties", None)
            return node | {"x-kubernetes-preserve-unknown-fields": True}
        if isinstance(node.get("additionalProperties"), dict):
            node["additionalProperties"] = self.node(node["additionalProperties"])
        if "items" in node:
            node["items"] = self.node(node["items"])
        if "description" in node:
            node["description"] = " ".join(node["description"].split())
        return node


def schema_of(model: type[BaseModel]) -> dict[str, Any]:
    """The structural openAPIV3Schema of a spec or status model."""
    raw = model.model_json_schema(by_alias=True, ref_template="#/$defs/{model}")
    defs = dict(raw.get("$defs", {}))
    defs[model.__name__] = {k: v for k, v in raw.items() if k != "$defs"}
    return _Converter(defs).model(model.__name__)


def status_schema() -> dict[str, Any]:
    schema = schema_of(status.EmbeddingModelStatus)
    conditions = schema["properties"]["conditions"]
    conditions["x-kubernetes-list-type"] = "map"
    conditions["x-kubernetes-list-map-keys"] = ["type"]
    return schema


def build_crd() -> dict[str, Any]:
    """The CustomResourceDefinition as a dict."""
    root = {
        "type": "object",
        "description": "EmbeddingModel: an embedding model served from GPU workers behind an HTTP gateway. "
        "A change to what shapes the worker pods is a new revision, promoted only after its CUDA-graph "
        "buckets are prewarmed and its graphs pass a smoke test against eager runs.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": schema_of(s.EmbeddingModelSpec),
            "status": status_schema(),
        },
        "x-kubernetes-validations": [NAME_RULE],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{s.PLURAL}.{s.GROUP}",
            "labels": {"app.kubernetes.io/name": "kembed", "app.kubernetes.io/part-of": "kembed"},
        },
        "spec": {
            "group": s.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": s.KIND,
                "listKind": f"{s.KIND}List",
                "plural": s.PLURAL,
                "singular": s.KIND.lower(),
                "shortNames": list(s.SHORT_NAMES),
                "categories": ["kembed"],
            },
            "versions": [
                {
                    "name": s.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": root},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.worker.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }


class _PlainDumper(yaml.SafeDumper):
    """Writes a section used twice (the gateway's and the workers' topologySpread) out twice, without
    YAML anchors and aliases, so the file reads like any other CRD."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render() -> str:
    header = "# Generated by `python -m kembed.operator.crd` from kembed.operator.spec. Do not edit.\n"
    return header + yaml.dump(build_crd(), Dumper=_PlainDumper, sort_keys=False, width=100)


if __name__ == "__main__":
    sys.stdout.write(render())
