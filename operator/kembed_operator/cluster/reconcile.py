"""One idempotent `reconcile`: read the world, let the state machine decide, make it so, return status.

It talks to the API server only through `Cluster` (apply.py: get/list/create/patch/delete/event on
the kinds in `rbac.RBAC_RULES`), so the tests run it against an in-memory fake; each object is
brought to its body by `apply` (by the hash of the body, as a merge patch), and the world is read
by observed.py. That is also how the drift timer repairs.
PodDisruptionBudgets and NetworkPolicies are listed by the model's label and brought to exactly the
set the spec wants (policies.py): a retired revision's budget or a disabled policy is deleted.
Objects made only for some settings (the bulk gateway's Deployment, Service and ServiceMonitor, the
gateway's HorizontalPodAutoscaler, the monitors of metrics.serviceMonitor) are deleted by name once
the spec no longer asks for them (`Cluster.delete_if_present`, which KubeCluster asks about an absent
one only once).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pydantic

from kembed.operator.build import autoscaling as a
from kembed.operator.build import endpoint as e
from kembed.operator.build import images as im
from kembed.operator.build import jobs as j
from kembed.operator.build import manifests as m
from kembed.operator.build import naming as n
from kembed.operator.build import policies
from kembed.operator.build.naming import Owner
from kembed.operator.build.revision import revision_of
from kembed.operator.cluster import model_resolve as mr
from kembed.operator.cluster.apply import Cluster, apply
from kembed.operator.cluster.observed import read_endpoint_gateway, read_gateway, read_workers
from kembed.operator.rollout import golden as g
from kembed.operator.rollout.job_results import job_key, judge_golden, read_jobs
from kembed.operator.rollout.rollout import decide
from kembed.operator.rollout.world import Event, JobState, Plan, World
from kembed.operator.spec.spec import EmbeddingModelSpec, parse_spec
from kembed.operator.spec.status import dump, parse_status

ROLLOUT_RESULTS = {"Promoted": "promoted", "RolloutBlocked": "blocked"}  # gate outcome by Event reason


def _ignore(*_: Any) -> None:
    pass


@dataclass(frozen=True)
class ReconcileHooks:
    """Plain callbacks for what a reconcile sees (the metrics; this module imports none)."""

    rollout_ended: Callable[[str], None] = _ignore  # "promoted" | "blocked", once per transition
    job_ended: Callable[[str, str, str, float], None] = _ignore  # (uid, kind, result, seconds), each
    # reconcile while the finished Job exists: the receiver counts a uid once
    model_fetch_failed: Callable[[str, str, str], None] = _ignore  # (uid, source, reason), each
    # reconcile while the failure is seen: the receiver counts a uid once


class InvalidSpec(Exception):
    """The spec cannot be reconciled as written; retrying will not help until it changes."""


@dataclass(frozen=True)
class Images:
    """The operator's default images, used where a spec leaves its image empty."""

    worker: str
    gateway: str


def keep_golden(cluster: Cluster, owner: Owner, plan: Plan) -> None:
    """Write the golden record the plan keeps, then drop the oldest past golden.MAX_RECORDS."""
    if plan.golden is None:
        return
    body = g.config_map(owner, plan.golden, plan.golden_revision, plan.golden_at)
    apply(cluster, body)
    for name in g.surplus(
        cluster.list("ConfigMap", owner.namespace, n.selector(owner, "golden")), body["metadata"]["name"]
    ):
        cluster.delete("ConfigMap", owner.namespace, name)


def _job_seconds(job: dict[str, Any]) -> float | None:
    """Start to completion (or to the Failed condition) of a finished Job, None if unknown."""
    status = job.get("status", {})
    ended = status.get("completionTime") or next(
        (c.get("lastTransitionTime") for c in status.get("conditions", []) if c.get("type") == "Failed"), None
    )
    if not status.get("startTime") or not ended:
        return None
    started = datetime.fromisoformat(status["startTime"])
    return max(0.0, (datetime.fromisoformat(ended) - started).total_seconds())


def report_jobs(
    job_states: dict[tuple[str, str, int], JobState], bodies: Iterable[dict[str, Any]], hooks: ReconcileHooks
) -> None:
    """Tell `hooks` the duration of every finished Job."""
    for job in bodies:
        key = job_key(job)
        kind = key[0]
        state = job_states.get(key)
        seconds = _job_seconds(job)
        if state is not None and state.phase != "Running" and seconds is not None:
            hooks.job_ended(
                job["metadata"].get("uid", job["metadata"]["name"]), kind, state.phase.lower(), seconds
            )


# --- the one reconcile ----------------------------------------------------------------------------


def owner_of(body: dict[str, Any]) -> Owner:
    meta = body["metadata"]
    return Owner(meta["name"], meta["namespace"], meta["uid"])


def typed_spec(body: dict[str, Any]) -> EmbeddingModelSpec:
    try:
        return parse_spec(body.get("spec") or {})
    except pydantic.ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
        raise InvalidSpec(problems) from None


def reconcile(
    cluster: Cluster,
    body: dict[str, Any],
    images: Images,
    now: datetime,
    hooks: ReconcileHooks | None = None,
    *,
    operator_namespace: str = "",
) -> dict[str, Any]:
    """Bring the cluster to what `body` asks for, one step of its rollout further; return the status.
    `operator_namespace` (where the operator runs, empty if unknown) is admitted to the workers'
    metrics port by their NetworkPolicy."""
    hooks = hooks or ReconcileHooks()
    owner, spec = owner_of(body), typed_spec(body)
    worker_image = spec.worker.image or images.worker
    gateway_image = spec.gateway.image or images.gateway
    if not worker_image or not gateway_image:
        raise InvalidSpec(
            "no worker or gateway image: set spec.worker.image and spec.gateway.image "
            "or the operator's default images"
        )
    if spec.rollout.require_digests:
        refs = {"worker image": worker_image, "gateway image": gateway_image}
        if spec.model.source.image is not None:
            refs["model image"] = spec.model.source.image.reference
        if missing := im.undigested(refs):
            raise InvalidSpec(
                f"rollout.requireDigests: {', '.join(missing)} has no digest; "
                "name it as image@sha256:<digest>"
            )
    # A huggingFace or s3 source: what it resolves to is part of the revision (model_resolve.py).
    fetched = mr.resolve(cluster, owner, spec, body.get("status"), now, worker_image)
    generation = body["metadata"].get("generation", 0)
    if fetched.is_pending:  # a changed source resolving, or failing to: the objects stay as they are
        report_fetch_failures(fetched.failures, spec, hooks)
        return mr.pending_status(body.get("status"), fetched, generation, now)
    revision = revision_of(spec, worker_image, fetched.resolved)
    job_states, job_bodies = read_jobs(cluster, owner)
    golden_records = judge_golden(cluster, owner, spec, job_states, job_bodies)
    world = World(
        spec=spec,
        generation=body["metadata"].get("generation", 0),
        revision=revision,
        now=now,
        workers=read_workers(cluster, owner),
        jobs=job_states,
        gateway=read_endpoint_gateway(cluster, owner, spec.endpoint)
        if spec.endpoint
        else read_gateway(cluster, owner, m.gateway_components(spec)),
        is_autoscaler_missing=spec.autoscaling.enabled
        and not cluster.serves("ScaledObject", owner.namespace),
        golden_records=golden_records,
    )
    plan = decide(world, parse_status(body.get("status")))
    fetch, failures = mr.prepare(cluster, owner, spec, fetched, revision, plan.revisions, worker_image)
    report_fetch_failures(failures, spec, hooks)
    carry_out(
        cluster, owner, spec, plan, worker_image, gateway_image, job_bodies, operator_namespace, fetch=fetch
    )
    report_jobs(job_states, job_bodies, hooks)
    for event in plan.events:
        if event.reason in ROLLOUT_RESULTS:
            hooks.rollout_ended(ROLLOUT_RESULTS[event.reason])
    status = status_body(owner, spec, plan)
    failed = mr.FetchState(fetched.status, fetched.resolved, failures=failures)
    return mr.with_model_status(
        status, failed, revision, plan.revisions, plan.status.active_revision, generation, now
    )


def report_fetch_failures(
    failures: Iterable[mr.FetchFailure], spec: EmbeddingModelSpec, hooks: ReconcileHooks
) -> None:
    for failure in failures:  # the receiver counts a uid once
        hooks.model_fetch_failed(
            failure.uid, "huggingFace" if spec.model.source.hugging_face else "s3", failure.reason
        )


def carry_out(
    cluster: Cluster,
    owner: Owner,
    spec: EmbeddingModelSpec,
    plan: Plan,
    worker_image: str,
    gateway_image: str,
    job_bodies: Iterable[dict[str, Any]],
    operator_namespace: str = "",
    *,
    fetch: mr.ModelFetch = mr.NO_FETCH,
) -> None:
    """`fetch`: a fetched source's pods get its fetch or cache volume, and are made only once a cache
    Job has filled the cache (model_resolve.py)."""
    for component in m.gateway_components(spec):
        apply(cluster, m.gateway_service(owner, spec, component))
    if plan.deploy is not None:
        apply(cluster, m.engine_config_map(owner, spec, plan.deploy))
        apply(cluster, m.worker_service(owner, spec, plan.deploy))
        image = (
            im.by_digest(worker_image, plan.worker_image_digest) if plan.worker_image_digest else worker_image
        )
        workers = fetch.fill(m.worker_deployment(owner, spec, plan.deploy, image), plan.deploy)
        if fetch.is_ready(plan.deploy):
            apply(cluster, a.with_replicas(workers, plan.worker_replicas))
    serving = plan.status.active_revision
    if plan.serving_replicas is not None and serving and serving != plan.deploy:  # a stepwise rollout
        scale = {"spec": {"replicas": plan.serving_replicas}}
        cluster.patch("Deployment", owner.namespace, n.workers_name(owner, serving), scale)
    if plan.autoscaled is not None:
        apply(cluster, a.scaled_object(owner, spec, plan.autoscaled))
    for request in plan.jobs:
        apply(cluster, fetch.fill(j.job(owner, spec, request, worker_image, gateway_image), request.revision))
    keep_golden(cluster, owner, plan)  # before the status that moves on to Promoting is written
    is_gateway_autoscaled = spec.gateway.autoscaling.enabled
    if spec.endpoint:  # a shared endpoint's gateway, not one of its own (build/endpoint.py)
        join_endpoint(cluster, owner, spec, plan, gateway_image)
    elif plan.gateway is not None and fetch.is_ready(plan.gateway):  # the revision the spec describes
        gateway = m.gateway_deployment(owner, spec, plan.gateway, gateway_image)
        gateway = fetch.fill(gateway, plan.gateway, skip_weights=True)  # a gateway reads no weights
        apply(cluster, a.with_replicas(gateway, None) if is_gateway_autoscaled else gateway)
        if spec.traffic_classes.bulk_gateway is not None:  # never autoscaled: bulkGateway.replicas
            bulk = m.gateway_deployment(owner, spec, plan.gateway, gateway_image, n.BULK_GATEWAY)
            apply(cluster, fetch.fill(bulk, plan.gateway, skip_weights=True))
    if is_gateway_autoscaled:  # never with an endpoint (the spec refuses it)
        apply(cluster, a.gateway_autoscaler(owner, spec))
    else:
        cluster.delete_if_present("HorizontalPodAutoscaler", owner.namespace, n.gateway_name(owner))
    monitor(cluster, owner, spec)
    if spec.traffic_classes.bulk_gateway is None:
        drop_bulk_gateway(cluster, owner)
    guard(cluster, owner, spec, plan, operator_namespace)
    for event in plan.events:
        cluster.event(owner, event.type, event.reason, event.message)
    _retire(cluster, owner, plan, job_bodies)


BULK_GATEWAY_KINDS = ("Deployment", "Service", "ServiceMonitor")  # its budget and policy: guard()


def join_endpoint(
    cluster: Cluster, owner: Owner, spec: EmbeddingModelSpec, plan: Plan, gateway_image: str
) -> None:
    """The model's part of its shared endpoint written (its entry, for the revision the gateway should
    send its work to), then the endpoint's gateway rebuilt from every member's entry; a gateway the
    model had of its own before it joined is deleted."""
    if plan.gateway is not None:
        apply(cluster, e.entry_config_map(owner, spec, plan.gateway, gateway_image))
    entries = cluster.list("ConfigMap", owner.namespace, {n.ENDPOINT_LABEL: spec.endpoint})
    if entries:
        for body in e.endpoint_objects(owner.namespace, spec.endpoint, entries):
            apply(cluster, body)
    for kind in BULK_GATEWAY_KINDS:
        cluster.delete_if_present(kind, owner.namespace, n.gateway_name(owner))


def drop_bulk_gateway(cluster: Cluster, owner: Owner) -> None:
    """trafficClasses.bulkGateway unset (or removed): delete what it made, if anything."""
    name = n.gateway_name(owner, n.BULK_GATEWAY)
    for kind in BULK_GATEWAY_KINDS:
        cluster.delete_if_present(kind, owner.namespace, name)


def monitor(cluster: Cluster, owner: Owner, spec: EmbeddingModelSpec) -> None:
    """The Prometheus operator's objects with metrics.serviceMonitor on (a ServiceMonitor per
    gateway, a PodMonitor for the workers); with it off, those an earlier spec made are deleted."""
    gateways = [m.service_monitor(owner, spec, c) for c in m.gateway_components(spec)]
    for body in [*gateways, m.worker_pod_monitor(owner, spec)]:
        if spec.metrics.service_monitor:
            apply(cluster, body)
        else:  # the bulk gateway's goes with the rest of it when that is unset (drop_bulk_gateway)
            cluster.delete_if_present(body["kind"], owner.namespace, body["metadata"]["name"])


def guard(
    cluster: Cluster, owner: Owner, spec: EmbeddingModelSpec, plan: Plan, operator_namespace: str = ""
) -> None:
    """Make the model's PodDisruptionBudgets (one per kept worker revision, one for the gateway) and
    NetworkPolicies exactly those the spec wants: apply each, delete the others."""
    wanted = policies.disruption_budgets(owner, spec, plan.revisions)
    wanted += policies.network_policies(owner, spec, operator_namespace)
    ours = {n.MODEL_LABEL: owner.name, "app.kubernetes.io/managed-by": n.MANAGED_BY}
    for kind in ("PodDisruptionBudget", "NetworkPolicy"):
        names = {body["metadata"]["name"] for body in wanted if body["kind"] == kind}
        for live in cluster.list(kind, owner.namespace, ours):
            if live["metadata"]["name"] not in names:
                cluster.delete(kind, owner.namespace, live["metadata"]["name"])
    for body in wanted:
        apply(cluster, body)


def _retire(cluster: Cluster, owner: Owner, plan: Plan, job_bodies: Iterable[dict[str, Any]]) -> None:
    """Delete what the plan no longer keeps: old revisions (after the gateway left them) and Jobs."""
    wanted_jobs = {(r.kind, r.revision, r.attempt) for r in plan.jobs} | plan.keep_jobs
    for job in job_bodies:
        if job_key(job) not in wanted_jobs:
            cluster.delete("Job", owner.namespace, job["metadata"]["name"])
    for deployment in cluster.list("Deployment", owner.namespace, n.selector(owner, "worker")):
        revision = deployment["metadata"]["labels"].get(n.REVISION_LABEL, "")
        if revision not in plan.revisions:
            cluster.delete("Deployment", owner.namespace, n.workers_name(owner, revision))
            cluster.delete("Service", owner.namespace, n.workers_name(owner, revision))
            cluster.delete("ConfigMap", owner.namespace, n.engine_config_name(owner, revision))
    # A ScaledObject only for the serving revision under autoscaling: a retired revision's goes with
    # it, and with autoscaling off the last one goes, so that worker.replicas holds again. (KEDA not
    # installed: the list is empty.)
    for scaled in cluster.list("ScaledObject", owner.namespace, n.selector(owner, "worker")):
        if scaled["metadata"]["labels"].get(n.REVISION_LABEL) != plan.autoscaled:
            cluster.delete("ScaledObject", owner.namespace, scaled["metadata"]["name"])


def status_body(owner: Owner, spec: EmbeddingModelSpec, plan: Plan) -> dict[str, Any]:
    status = plan.status
    serving = status.active_revision
    body = dump(status)
    body["selector"] = n.selector_string(n.selector(owner, "worker", serving)) if serving else ""
    body["gatewayURL"] = (
        e.endpoint_url(owner.namespace, spec.endpoint, spec) if spec.endpoint else m.gateway_url(owner, spec)
    )
    if spec.traffic_classes.bulk_gateway is not None:
        body["bulkGatewayURL"] = m.gateway_url(owner, spec, n.BULK_GATEWAY)
    elif "bulkGatewayURL" in body:  # left from when it was set: a merge patch removes it as null
        body["bulkGatewayURL"] = None
    body.setdefault("rollout", None)  # explicit null: a merge patch must remove a finished rollout
    return body


def invalid_status(body: dict[str, Any], message: str, now: datetime) -> dict[str, Any]:
    """Status for a spec that cannot be reconciled: phase Invalid, Ready False, reason InvalidSpec."""
    status = parse_status(body.get("status"))
    generation = body["metadata"].get("generation", 0)
    conditions = [c for c in status.conditions if c.type != "Ready"]
    ready = {
        "type": "Ready",
        "status": "False",
        "reason": "InvalidSpec",
        "message": message[:2000],
        "lastTransitionTime": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "observedGeneration": generation,
    }
    out = dump(status.model_copy(update={"conditions": conditions, "observed_generation": generation}))
    out["conditions"] = sorted([*out["conditions"], ready], key=lambda c: c["type"])
    out["phase"] = "Invalid"
    return out


__all__ = ["Cluster", "Event", "Images", "InvalidSpec", "apply", "reconcile"]
