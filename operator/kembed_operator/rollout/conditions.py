"""The status conditions a rollout's plan writes: Prewarmed, SmokeTestPassed, RolloutBlocked,
Progressing, Ready and Degraded while a candidate is gated, Autoscaling whenever autoscaling is on.
`set_condition` moves a condition's lastTransitionTime only when its value changes."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from kembed.operator.rollout.world import Workers, World
from kembed.operator.spec.status import Condition, ConditionType, EmbeddingModelStatus, RolloutState


def timestamp(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def age_s(since: str, now: datetime) -> float:
    started = datetime.strptime(since, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=now.tzinfo)
    return (now - started).total_seconds()


def set_condition(
    status: EmbeddingModelStatus, type_: ConditionType, value: bool, reason: str, message: str, world: World
) -> EmbeddingModelStatus:
    """`status` with one condition set; lastTransitionTime moves only when the value changes."""
    text: Literal["True", "False"] = "True" if value else "False"
    old = next((c for c in status.conditions if c.type == type_), None)
    changed_at = old.last_transition_time if old is not None and old.status == text else timestamp(world.now)
    new = Condition(
        type=type_,
        status=text,
        reason=reason,
        message=message,
        last_transition_time=changed_at,
        observed_generation=world.generation,
    )
    others = [c for c in status.conditions if c.type != type_]
    return status.model_copy(update={"conditions": sorted([*others, new], key=lambda c: c.type)})


def autoscaling_condition(status: EmbeddingModelStatus, world: World) -> EmbeddingModelStatus:
    """The Autoscaling condition: whether KEDA can act on the ScaledObject; absent when off."""
    if not world.spec.autoscaling.enabled:
        return status.model_copy(
            update={"conditions": [c for c in status.conditions if c.type != "Autoscaling"]}
        )
    if world.is_autoscaler_missing:
        message = (
            "the cluster serves no keda.sh/v1alpha1 ScaledObject (is KEDA installed?): nothing scales "
            "the workers, which keep their current pod count"
        )
        return set_condition(status, "Autoscaling", False, "KedaMissing", message, world)
    message = "KEDA scales the serving revision's workers on their queued tokens"
    return set_condition(status, "Autoscaling", True, "ScaledObjectApplied", message, world)


def rollout_conditions(
    world: World, status: EmbeddingModelStatus, rollout: RolloutState
) -> EmbeddingModelStatus:
    stage, candidate, active = rollout.stage, rollout.revision, status.active_revision
    order = ["Deploying", "Prewarming", "SmokeTesting", "Mixing", "Promoting"]
    reached = order.index(stage) if stage in order else -1
    is_blocked = stage == "Blocked"
    if is_blocked:
        prewarmed = rollout.reason not in ("CandidateNotReady", "PrewarmFailed", "PrewarmTimedOut")
        smoked = False
    else:
        prewarmed, smoked = reached >= 2, reached >= 3
    status = set_condition(
        status,
        "Prewarmed",
        prewarmed,
        "Prewarmed" if prewarmed else "NotPrewarmed",
        f"revision {candidate}",
        world,
    )
    status = set_condition(
        status, "SmokeTestPassed", smoked, "Passed" if smoked else "NotPassed", f"revision {candidate}", world
    )
    status = set_condition(
        status,
        "RolloutBlocked",
        is_blocked,
        rollout.reason if is_blocked else "NotBlocked",
        rollout.message if is_blocked else "",
        world,
    )
    status = set_condition(
        status,
        "Progressing",
        not is_blocked,
        stage if not is_blocked else rollout.reason,
        f"revision {candidate}: {stage} (attempt {rollout.attempt})",
        world,
    )
    serving = world.workers.get(active, Workers(0, ())) if active else Workers(0, ())
    gateway = world.gateway
    is_serving = bool(active) and gateway is not None and gateway.num_ready > 0 and serving.num_ready > 0
    message = f"revision {active} serves" if is_serving else "no revision serves yet"
    status = set_condition(
        status, "Ready", is_serving, "Serving" if is_serving else "NotServing", message, world
    )
    is_short = bool(active) and serving.num_ready < serving.replicas
    return set_condition(
        status,
        "Degraded",
        is_short,
        "WorkersUnavailable" if is_short else "AllWorkersReady",
        f"{serving.num_ready}/{serving.replicas} workers of {active or 'none'} ready",
        world,
    )
