"""The pod settings of pod_spec.py as pod-spec, container and template fields: pure functions over
`PodSettings`, each field rendered only when set, so that a model that sets none renders exactly the
pods it rendered before these settings existed. `manifests.py` and `jobs.py` put them in place.
"""

from __future__ import annotations

from typing import Any

from kembed.operator.spec.pod_spec import PodSecuritySpec, PodSettings


def pod_security(security: PodSecuritySpec) -> dict[str, Any]:
    """A pod's securityContext: non-root and seccomp RuntimeDefault always; the UID, GID and fsGroup
    only with fixedIds (else the cluster assigns them: OpenShift's restricted-v2 SCC does)."""
    ids = (
        {"runAsUser": security.run_as_user, "runAsGroup": security.run_as_group, "fsGroup": security.fs_group}
        if security.fixed_ids
        else {}
    )
    return {"runAsNonRoot": True, **ids, "seccompProfile": {"type": "RuntimeDefault"}}


def container_security() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def pod_fields(pod: PodSettings) -> dict[str, Any]:
    """Pod-spec fields: placement, then pull secrets, service account and runtime class."""
    out: dict[str, Any] = {}
    if pod.node_selector:
        out["nodeSelector"] = dict(pod.node_selector)
    if pod.tolerations:
        out["tolerations"] = [dict(t) for t in pod.tolerations]
    if pod.affinity:
        out["affinity"] = dict(pod.affinity)
    return out | pull_and_identity(pod)


def pull_and_identity(pod: PodSettings) -> dict[str, Any]:
    """imagePullSecrets, serviceAccountName and runtimeClassName, each when set."""
    out: dict[str, Any] = {}
    if pod.image_pull_secrets:
        out["imagePullSecrets"] = [{"name": ref.name} for ref in pod.image_pull_secrets]
    if pod.service_account_name:
        out["serviceAccountName"] = pod.service_account_name
    if pod.runtime_class_name:
        out["runtimeClassName"] = pod.runtime_class_name
    return out


def job_pod_fields(worker: PodSettings) -> dict[str, Any]:
    """What the rollout Jobs take from the workers' pods: they run the worker image (its pull secrets),
    under the workers' service account (what it is granted, its pull secrets), and tolerate what the
    workers tolerate (a cluster of tainted GPU nodes only would leave them Pending otherwise). Not the
    runtime class, node selector or affinity: a Job is a small gRPC client that needs no GPU."""
    fields = {k: v for k, v in pull_and_identity(worker).items() if k != "runtimeClassName"}
    if worker.tolerations:
        fields["tolerations"] = [dict(t) for t in worker.tolerations]
    return fields


def golden_pod_fields(gateway: PodSettings) -> dict[str, Any]:
    """What the golden Job takes from the gateway's pods: it runs the gateway image on the model
    volume the gateway mounts, so it goes where the gateway may (placement) as the gateway does
    (pull secrets, service account). Not the runtime class."""
    return {k: v for k, v in pod_fields(gateway).items() if k != "runtimeClassName"}


def env(pod: PodSettings) -> list[dict[str, Any]]:
    """The extra variables as EnvVars, unset fields left out."""
    return [e.model_dump(by_alias=True, exclude_defaults=True, mode="json") for e in pod.env]


def env_from(pod: PodSettings) -> list[dict[str, Any]]:
    """The extra envFrom sources, unset fields left out."""
    return [e.model_dump(by_alias=True, exclude_defaults=True, mode="json") for e in pod.env_from]


def template_metadata(
    pod: PodSettings, labels: dict[str, str], annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    """A pod template's metadata: the spec's pod labels under the operator's `labels` (the CRD refuses
    the operator's keys; a merge lets ours win all the same), and its annotations beside `annotations`."""
    out: dict[str, Any] = {"labels": {**pod.pod_labels, **labels}}
    merged = {**pod.pod_annotations, **(annotations or {})}
    if merged:
        out["annotations"] = merged
    return out
