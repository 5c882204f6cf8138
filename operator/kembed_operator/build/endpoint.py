"""Pure builders of a shared endpoint (spec.endpoint): one gateway Deployment and Service for every
model of a namespace that names it. No I/O.

Each member model writes its part, an *entry* ConfigMap: the gateway Deployment and Service it
would run alone, for the revision its gateway should send work to (manifests.gateway_deployment).
The endpoint is built from every member's entry, sorted by model name, so whichever member
reconciles renders the same objects: the first member's gateway pod as the template (its image,
replicas, resources, Service, API key, connection bounds, the HTTP edge's settings), each member's
model directory mounted at `/models/<model>` and its per-model settings (workers, chunking,
limits, classes, prompts, hold) as one entry of `KEMBED_GATEWAY_MODELS` (gateway/endpoint.py).
"""

from __future__ import annotations

import copy
import json
from typing import Any

from kembed.operator.build import manifests as m
from kembed.operator.build import naming as n
from kembed.operator.build.naming import Owner
from kembed.operator.spec.spec import EmbeddingModelSpec

PREFIX = "KEMBED_GATEWAY_"
# The gateway's HTTP edge settings (gateway/endpoint.py EDGE_FIELDS): the endpoint's, from its first
# model; every other KEMBED_GATEWAY_* variable of a member's gateway is that model's own.
EDGE_VARIABLES = frozenset(
    PREFIX + name.upper()
    for name in (
        "host", "port", "processes", "api_key", "worker_auth_token", "max_request_bytes",
        "header_timeout_s", "body_timeout_s", "keep_alive_timeout_s", "max_header_bytes", "max_headers",
        "max_connections", "log_level", "models", "default_model",
    )
)  # fmt: skip
MODELS_ROOT = "/models"


def entry_config_map(owner: Owner, spec: EmbeddingModelSpec, revision: str, image: str) -> dict[str, Any]:
    """A member's part of its endpoint: its gateway as it would run alone, pointed at `revision`."""
    assert spec.endpoint, "only a model behind a shared endpoint has an entry"
    deployment = m.gateway_deployment(owner, spec, revision, image)
    service = m.gateway_service(owner, spec)
    labels = n.labels(owner, n.ENDPOINT_ENTRY) | {n.ENDPOINT_LABEL: spec.endpoint}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": m.metadata(owner, n.endpoint_entry_name(owner), n.ENDPOINT_ENTRY) | {"labels": labels},
        "data": {
            "model": owner.name,
            "uid": owner.uid,
            "revision": revision,
            "deployment": json.dumps(deployment, sort_keys=True),
            "service": json.dumps(service, sort_keys=True),
        },
    }


def _model_entry(model: str, container: dict[str, Any]) -> dict[str, Any]:
    """A member's `KEMBED_GATEWAY_MODELS` entry, from its lone gateway's variables (values as the
    environment gives them: the gateway reads them alike)."""
    entry: dict[str, Any] = {"model_dir": f"{MODELS_ROOT}/{model}"}
    for variable in container["env"]:
        name = variable["name"]
        if not name.startswith(PREFIX) or name in EDGE_VARIABLES or "value" not in variable:
            continue
        field = name.removeprefix(PREFIX).lower()
        if field == "model_dir":
            continue
        value = variable["value"]
        if field == "served_model_names":
            entry[field] = [part.strip() for part in value.split(",") if part.strip()]
        else:
            entry[field] = value
    entry.setdefault("served_model_names", [model])  # the EmbeddingModel's name, not "model"
    return entry


def _renamed(
    model: str, volume: dict[str, Any], mount: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    name = f"model-{model}"
    return volume | {"name": name}, mount | {"name": name, "mountPath": f"{MODELS_ROOT}/{model}"}


def endpoint_objects(namespace: str, endpoint: str, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The endpoint's gateway Deployment and Service from its members' entry ConfigMaps."""
    members = sorted(entries, key=lambda e: e["data"]["model"])
    assert members, "an endpoint has one model at least"
    first = json.loads(members[0]["data"]["deployment"])
    deployment = copy.deepcopy(first)
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    models, volumes, mounts, revisions = [], [], [], {}
    for member in members:
        model = member["data"]["model"]
        alone = json.loads(member["data"]["deployment"])
        alone_pod = alone["spec"]["template"]["spec"]
        volume = next(v for v in alone_pod["volumes"] if v["name"] == "model")
        mount = next(v for v in alone_pod["containers"][0]["volumeMounts"] if v["name"] == "model")
        renamed = _renamed(model, volume, mount)
        volumes.append(renamed[0])
        mounts.append(renamed[1])
        models.append(_model_entry(model, alone_pod["containers"][0]))
        revisions[n.endpoint_revision_key(model)] = member["data"]["revision"]
    edge = [e for e in container["env"] if not e["name"].startswith(PREFIX) or e["name"] in EDGE_VARIABLES]
    edge = [e for e in edge if e["name"] != PREFIX + "PROCESSES"]  # several models: one process a pod
    container["env"] = [*edge, {"name": PREFIX + "MODELS", "value": json.dumps(models, sort_keys=True)}]
    container["volumeMounts"] = [v for v in container["volumeMounts"] if v["name"] != "model"] + mounts
    pod["volumes"] = [v for v in pod["volumes"] if v["name"] != "model"] + volumes
    name = n.endpoint_name(endpoint)
    selector = n.endpoint_selector(endpoint)
    labels = {k: v for k, v in first["metadata"]["labels"].items() if k != n.MODEL_LABEL} | selector
    labels["app.kubernetes.io/instance"] = name
    # Every member owns it (none controls it): it goes once the last of them is deleted.
    owners = [
        {
            "apiVersion": first["metadata"]["ownerReferences"][0]["apiVersion"],
            "kind": first["metadata"]["ownerReferences"][0]["kind"],
            "name": member["data"]["model"],
            "uid": member["data"]["uid"],
        }
        for member in members
    ]
    metadata = {"name": name, "namespace": namespace, "labels": labels, "ownerReferences": owners}
    deployment["metadata"] = metadata
    deployment["spec"]["selector"] = {"matchLabels": selector}
    template = deployment["spec"]["template"]["metadata"]
    template["labels"] = {k: v for k, v in template["labels"].items() if k != n.MODEL_LABEL} | labels
    annotations = {k: v for k, v in template.get("annotations", {}).items() if k != n.REVISION_LABEL}
    template["annotations"] = annotations | revisions
    service = json.loads(members[0]["data"]["service"])
    service["metadata"] = copy.deepcopy(metadata)
    service["spec"]["selector"] = selector
    return [deployment, service]


def endpoint_url(namespace: str, endpoint: str, spec: EmbeddingModelSpec) -> str:
    """The endpoint's URL as a member names it (its own Service port: the first member's serves)."""
    port = spec.gateway.service.port
    return f"http://{n.endpoint_name(endpoint)}.{namespace}.svc{'' if port == 80 else f':{port}'}"
