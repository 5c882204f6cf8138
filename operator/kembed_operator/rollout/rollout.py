"""The rollout state machine, as one pure function: observed world + last status → plan + new status.

    Deploying ──candidate pods ready──▶ Prewarming ──Job ok──▶ SmokeTesting ──Job ok──▶ Promoting
        │ not ready in time              │ failed / timed out     │ failed / timed out     │ gateway
        ▼                                ▼                        ▼                        ▼ rolled
     Blocked ◀───────────────────────────┴────────────────────────┘                   serving R,
        │ metadata.generation moves on (a later spec change): attempt + 1, Deploying   old retired

The stage, attempt, stage start and prewarmed pod addresses live in `status.rollout`, so a restarted
operator resumes where it was; Job names carry revision and attempt, so it finds its Jobs again.
While blocked, the serving revision and the gateway are untouched and the candidate's workers are
removed (they hold GPUs); the failed Job stays for its logs. If the candidate's pods change after
prewarming (a restart loses its graphs), prewarming starts over as a new attempt.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kembed.operator.rollout import gate, stepwise
from kembed.operator.rollout.conditions import (
    age_s,
    autoscaling_condition,
    rollout_conditions,
    set_condition,
    timestamp,
)
from kembed.operator.rollout.golden import GoldenRecord
from kembed.operator.rollout.world import Event, Plan, Workers, World
from kembed.operator.spec.status import EmbeddingModelStatus, RolloutState


def decide(world: World, status: EmbeddingModelStatus) -> Plan:
    """The plan for `world`, given the status last written. Pure: same inputs, same plan.

    Level-triggered where it matters for serving: a revision whose promotion the gateway has
    finished is promoted whatever the spec asks for now; a promotion in flight when the spec moves
    on to another new revision is finished first (the gateway, rendered from the spec, is never
    pointed at a revision the spec does not describe); a spec back at the serving revision renders
    the gateway back to it; and no revision a gateway pod still points at is deleted."""
    status = status.model_copy(update={"observed_generation": world.generation})
    status, events = _promoted_by_gateway(world, status)
    rollout, active = status.rollout, status.active_revision
    if active and active == world.revision:
        plan = _serve(world, status, events)
    elif rollout is not None and rollout.stage == "Promoting" and rollout.revision != world.revision:
        plan = _finish_promoting(world, status, rollout, events)
    else:
        plan = _roll(world, status, events)
    in_use = world.gateway.in_use if world.gateway is not None else frozenset()
    kept = plan.revisions | (in_use & set(world.workers))
    return dataclasses.replace(plan, revisions=kept, status=autoscaling_condition(plan.status, world))


def _promoted_by_gateway(
    world: World, status: EmbeddingModelStatus
) -> tuple[EmbeddingModelStatus, tuple[Event, ...]]:
    """The status with a promotion the gateway has finished recorded: its revision active, the old
    one to be retired (once no gateway pod points at it), whatever the spec asks for now."""
    rollout, active = status.rollout, status.active_revision
    if rollout is None or rollout.stage != "Promoting" or not _is_gateway_on(world, rollout.revision):
        return status, ()
    message = f"revision {rollout.revision} serves" + (f"; {active} retired" if active else "")
    promoted = status.model_copy(
        update={"active_revision": rollout.revision, "rollout": None, "candidate_revision": ""}
        | _gated_image(rollout)
    )
    return promoted, (Event("Normal", "Promoted", message),)


def _finish_promoting(
    world: World, status: EmbeddingModelStatus, rollout: RolloutState, events: tuple[Event, ...]
) -> Plan:
    """The spec moved on to a new revision while the gateway was switching to the candidate, which
    passed its gates: let the gateway finish (neither it nor the candidate's workers are rendered
    again, since the spec no longer describes them), then promote it and roll the new one out from
    there. A gateway that does not finish within promoteTimeoutSeconds blocks the candidate; both
    revisions stay while gateway pods point at them, and the next pass rolls the new one out."""
    active, candidate = status.active_revision, rollout.revision
    if age_s(rollout.stage_started_at, world.now) > world.spec.rollout.promote_timeout_seconds:
        step = gate.block(world, rollout, "PromoteTimedOut", gate.promote_timeout_message(world, rollout))
        blocked = status.model_copy(update={"rollout": step.rollout})
        return _roll(world, blocked, (*events, *step.events))
    status = _counts(status, world, active) if active else status
    status = rollout_conditions(world, status, rollout)
    status = set_condition(
        status,
        "Progressing",
        True,
        "Promoting",
        f"revision {candidate}: the gateway is switching to it; revision {world.revision} (the spec's) "
        "rolls out once it has",
        world,
    )
    return Plan(
        status=status.model_copy(update={"phase": "Progressing", "candidate_revision": candidate}),
        revisions=frozenset(r for r in (active, candidate) if r),
        deploy=None,
        gateway=None,
        events=events,
        autoscaled=active if world.spec.autoscaling.enabled and active else None,
    )


# --- serving: no rollout --------------------------------------------------------------------------


def _serve(world: World, status: EmbeddingModelStatus, events: tuple[Event, ...]) -> Plan:
    active = status.active_revision
    workers = world.workers.get(active, Workers(0, ()))
    gateway = world.gateway
    is_switched = gateway is not None and gateway.revision == active and gateway.is_rolled_out
    is_serving = gateway is not None and gateway.num_ready > 0 and workers.num_ready > 0
    wanted = _serving_replicas(world, active)
    is_short = workers.num_ready < wanted
    status = status.model_copy(update={"candidate_revision": "", "rollout": None})
    status, drift = _image_drift(status, workers)
    events = (*events, *drift)
    status = _counts(status, world, active)
    status = set_condition(status, "RolloutBlocked", False, "NotBlocked", "", world)
    status = set_condition(
        status,
        "Progressing",
        not is_switched,
        "GatewayRolling" if not is_switched else "Serving",
        f"revision {active}" + (": the gateway is rolling" if not is_switched else " serves"),
        world,
    )
    status = set_condition(
        status,
        "Ready",
        is_serving,
        "Serving" if is_serving else "NotServing",
        f"{workers.num_ready}/{wanted} workers of {active} ready",
        world,
    )
    status = set_condition(
        status,
        "Degraded",
        is_short,
        "WorkersUnavailable" if is_short else "AllWorkersReady",
        f"{workers.num_ready}/{wanted} workers ready",
        world,
    )
    # Short of workers while serving is a scale-up or a restart under way (the Degraded condition
    # says so); Degraded as a phase means nothing answers.
    phase = "Degraded" if not is_serving else ("Ready" if is_switched and not is_short else "Progressing")
    return Plan(
        status=status.model_copy(update={"phase": phase}),
        revisions=frozenset({active}),
        deploy=active,
        gateway=active,
        events=events,
        worker_replicas=None if world.spec.autoscaling.enabled else _serving_replicas_asked(world, active),
        autoscaled=active if world.spec.autoscaling.enabled else None,
        worker_image_digest=status.active_image_digest if status.active_image_pinned else "",
    )


def _image_drift(
    status: EmbeddingModelStatus, workers: Workers
) -> tuple[EmbeddingModelStatus, tuple[Event, ...]]:
    """A serving pod that runs another worker image than the revision passed its gate with (its tag
    moved, and a node pulled it anew) pins the revision's Deployment to the gated digest: its rolling
    update replaces such pods with the image that passed the gate."""
    gated = status.active_image_digest
    others = workers.image_digests - {gated}
    if not gated or not others or status.active_image_pinned:
        return status, ()
    message = (
        f"revision {status.active_revision}: a serving pod runs worker image {', '.join(sorted(others))}, "
        f"not {gated} that passed the gate (its tag moved): its Deployment now names the gated digest"
    )
    return status.model_copy(update={"active_image_pinned": True}), (Event("Warning", "ImageDrift", message),)


def _counts(status: EmbeddingModelStatus, world: World, serving: str) -> EmbeddingModelStatus:
    ready = world.workers[serving].num_ready if serving in world.workers else 0
    return status.model_copy(update={"replicas": _serving_replicas(world, serving), "ready_replicas": ready})


def _serving_replicas_asked(world: World, active: str) -> int:
    """The spec's replicas, held within R + s while a stepwise rollout's other pods go (stepwise.py)."""
    back = stepwise.serving_back(world, active)
    return world.spec.worker.replicas if back is None else back


def _serving_replicas(world: World, revision: str) -> int:
    """Pods the serving revision should have: the autoscaler's count (its Deployment's) or the spec's."""
    if world.spec.autoscaling.enabled:
        return world.workers[revision].replicas if revision in world.workers else 0
    return world.spec.worker.replicas


def _starting_replicas(world: World, active: str) -> int:
    """The candidate's pods under autoscaling: as many as serve now, so the new revision takes the load
    at once; at least one, so that a revision scaled to zero is still gated; within min and max."""
    a = world.spec.autoscaling
    serving = world.workers[active].replicas if active in world.workers else 0
    return min(max(serving, a.min_replicas, 1), a.max_replicas)


# --- rolling out a candidate ----------------------------------------------------------------------


def _roll(world: World, status: EmbeddingModelStatus, earlier: tuple[Event, ...] = ()) -> Plan:
    candidate, active = world.revision, status.active_revision
    rollout = status.rollout if status.rollout and status.rollout.revision == candidate else None
    events: list[Event] = list(earlier)
    if rollout is None:
        rollout = gate.start(world, attempt=1, active=active)
        events.append(Event("Normal", "RolloutStarted", f"rolling out revision {candidate}"))
    elif rollout.stage == "Blocked" and gate.is_changed_since_block(world, rollout):
        rollout = gate.start(world, attempt=rollout.attempt + 1, active=active)
        events.append(Event("Normal", "RolloutRetried", f"spec changed: retrying revision {candidate}"))
    if world.spec.autoscaling.enabled and rollout.replicas is None:  # also when turned on mid-rollout
        rollout = gate.replace_state(rollout, replicas=_starting_replicas(world, active))

    step = gate.step(world, rollout, active)
    # The gate passed in this pass: a golden answer to keep goes with the plan.
    is_gated = rollout.stage == "SmokeTesting" and step.rollout.stage == "Promoting"
    golden = world.golden_records.get(("golden", candidate, rollout.attempt)) if is_gated else None
    rollout, events = step.rollout, events + list(step.events)
    if rollout.stage == "Promoting" and _is_gateway_on(world, candidate):
        promoted = status.model_copy(update={"active_revision": candidate} | _gated_image(rollout))
        message = f"revision {candidate} serves" + (f"; {active} retired" if active else "")
        plan = _serve(
            world, promoted, (*events, *_recorded(golden, candidate), Event("Normal", "Promoted", message))
        )
        return dataclasses.replace(
            plan, golden=golden, golden_revision=candidate if golden else "", golden_at=timestamp(world.now)
        )
    events += _recorded(golden, candidate)

    status = status.model_copy(update={"candidate_revision": candidate, "rollout": rollout})
    status = (
        _counts(status, world, active)
        if active
        else status.model_copy(
            update={"replicas": gate.candidate_replicas(world, rollout), "ready_replicas": 0}
        )
    )
    status = rollout_conditions(world, status, rollout)
    is_blocked = rollout.stage == "Blocked"
    keep_jobs = frozenset((kind, candidate, rollout.attempt) for kind in gate.JOB_KINDS)
    gateway, serving_replicas = stepwise.gateway_and_serving(world, rollout, active)
    # The candidate is not autoscaled before it serves: its pods are the ones the gate checks.
    candidate_replicas = gate.candidate_replicas(world, rollout)
    if rollout.step_replicas is not None and active in world.workers:  # within R + s (stepwise.room)
        serving = serving_replicas if serving_replicas is not None else world.workers[active].replicas
        candidate_replicas = stepwise.candidate_asked(world, rollout, active, serving)
    return Plan(
        status=status.model_copy(update={"phase": "Blocked" if is_blocked else "Progressing"}),
        revisions=frozenset(r for r in (active, None if is_blocked else candidate) if r),
        deploy=None if is_blocked else candidate,
        gateway=gateway,
        serving_replicas=serving_replicas,
        jobs=step.jobs,
        keep_jobs=keep_jobs,
        events=tuple(events),
        worker_replicas=candidate_replicas,
        autoscaled=active if world.spec.autoscaling.enabled and active else None,
        golden=golden,
        golden_revision=candidate if golden is not None else "",
        golden_at=timestamp(world.now),
    )


def _recorded(golden: GoldenRecord | None, revision: str) -> list[Event]:
    if golden is None:
        return []
    short = golden.weights.removeprefix("sha256:")[:12]
    return [
        Event(
            "Normal", "GoldenRecorded", f"revision {revision}: the golden answer of weights {short} is kept"
        )
    ]


def _gated_image(rollout: RolloutState) -> dict[str, Any]:
    """The status fields of a promoted revision's image: the digest its gated pods ran, not pinned."""
    return {"active_image_digest": rollout.image_digest, "active_image_pinned": False}


def _is_gateway_on(world: World, revision: str) -> bool:
    return world.gateway is not None and world.gateway.revision == revision and world.gateway.is_rolled_out
