"""A stepwise rollout (`rollout.maxSurgeReplicas` = s), for clusters without a second set of GPUs.

    canary: s candidate pods beside the R serving ones, the whole gate on them
      │ the golden Job found the answers of the serving weights (the revisions are interchangeable)
      ▼
    Mixing: the gateway serves from both revisions' pods (one pool: both headless Services)
      │ rolled out
      ▼
    step k: candidate asks k·s pods (at most R), the serving revision R + s - k·s; the step's new pods
      │ pass prewarm, smoke and golden Jobs of their own (the golden Job compares them with a gated
      │ pod), as a new attempt
      ▼
    candidate at R, gated ──▶ Promoting (the gateway onto the candidate alone; the serving revision,
                              down to s pods, is retired as without steps)

At most R + s pods are asked, and the pods serving never fall below R while the revisions mix: the
serving revision shrinks by s as the candidate asks s more, whose s gated pods already serve. A
candidate that answers otherwise (new weights, `golden: Record` or Off) is never mixed with the
serving revision, whose vectors would not compare with its own: after its canary it grows to R
beside the serving revision (the new pods gated as a new attempt), as without steps. A block, or a
spec that moves on, takes the gateway back onto the serving revision alone and the serving revision
back to its size, still within R + s (`room`, which counts every revision's pods): the pods of a
candidate still in the gateway's pool (a gateway pod still sends it work) are held until it lets
them go, and only then does the serving revision grow back and a new candidate start its canary.
"""

from __future__ import annotations

from kembed.operator.rollout.world import Event, World
from kembed.operator.spec.status import RolloutState

STEPPING = ("Mixing", "Deploying", "Prewarming", "SmokeTesting")


def mixed(active: str, candidate: str) -> str:
    """The gateway's revision while it serves from both ("<serving>+<candidate>")."""
    return f"{active}+{candidate}"


def is_mixing(rollout: RolloutState) -> bool:
    """Whether the gateway should serve from both revisions: the canary passed and they answer alike."""
    return rollout.step_replicas is not None and bool(rollout.gated) and rollout.stage in STEPPING


def is_gateway_mixed(world: World, rollout: RolloutState, active: str) -> bool:
    gateway = world.gateway
    return (
        gateway is not None and gateway.revision == mixed(active, rollout.revision) and gateway.is_rolled_out
    )


def serving_wanted(world: World, rollout: RolloutState) -> int:
    """The serving revision's pods while the candidate asks for `step_replicas`: R + s - asked, at most R."""
    whole = max(1, world.spec.worker.replicas)
    surge = world.spec.rollout.max_surge_replicas or 0
    asked = rollout.step_replicas if rollout.step_replicas is not None else whole
    return max(0, min(whole, whole + surge - asked))


def held(world: World, *besides: str) -> int:
    """Pods of the revisions other than `besides` (a candidate left behind by a block or a spec that
    moved on, kept while a gateway pod still sends it work): asked, or ready if more."""
    return sum(
        max(workers.replicas, workers.num_ready)
        for revision, workers in world.workers.items()
        if revision not in besides
    )


def room(world: World, rollout: RolloutState, active: str) -> int:
    """Pods the serving revision and the candidate may ask together: R + s less what others hold."""
    whole = max(1, world.spec.worker.replicas)
    return max(
        0, whole + (world.spec.rollout.max_surge_replicas or 0) - held(world, active, rollout.revision)
    )


def serving_back(world: World, active: str) -> int | None:
    """The serving revision's pods once no rollout is under way, for a stepwise spec: R, but within
    R + s while another revision's pods are still held (its gateway moving off them); None without
    steps (the spec's replicas)."""
    surge = world.spec.rollout.max_surge_replicas
    if surge is None or world.spec.autoscaling.enabled or active not in world.workers:
        return None
    whole = world.spec.worker.replicas
    return min(whole, max(world.workers[active].replicas, whole + surge - held(world, active)))


def candidate_asked(world: World, rollout: RolloutState, active: str, serving: int) -> int:
    """The candidate's pods in a stepwise rollout, beside `serving` pods of the serving revision:
    what its step asks, within the room left (0 while the pods of others still take it)."""
    assert rollout.step_replicas is not None
    return max(0, min(rollout.step_replicas, room(world, rollout, active) - serving))


def after_gate(
    world: World, rollout: RolloutState, active: str, is_alike: bool, whole: int
) -> tuple[RolloutState, tuple[Event, ...]]:
    """The state after a step's Jobs passed: Promoting once the candidate is whole; after the canary,
    Mixing (alike) or growing to whole size unmixed (not alike); else the next step."""
    assert rollout.step_replicas is not None
    gated = sorted({*rollout.gated, *rollout.targets})
    state = rollout.model_copy(update={"gated": gated, "targets": []})
    if rollout.step_replicas >= whole:
        return state.model_copy(update={"stage": "Promoting"}), ()
    if not rollout.gated and not is_alike:
        message = (
            f"revision {rollout.revision} does not answer the golden texts as the serving weights do (new "
            f"weights, or rollout.golden Record or Off): it is not mixed with revision {active}, and grows "
            f"to {whole} pods beside it (rollout.maxSurgeReplicas needs a revision that answers alike)"
        )
        grown = state.model_copy(
            update={"stage": "Deploying", "step_replicas": None, "attempt": rollout.attempt + 1}
        )
        return grown, (Event("Warning", "StepwiseNotMixed", message),)
    if not rollout.gated:
        message = (
            f"revision {rollout.revision} answers as revision {active}: the gateway serves from both while "
            f"it grows {world.spec.rollout.max_surge_replicas} pod(s) a step to {whole}"
        )
        return state.model_copy(update={"stage": "Mixing"}), (Event("Normal", "Mixing", message),)
    return next_step(world, state, active, whole)


def next_step(
    world: World, rollout: RolloutState, active: str, whole: int
) -> tuple[RolloutState, tuple[Event, ...]]:
    assert rollout.step_replicas is not None
    surge = world.spec.rollout.max_surge_replicas or 1
    asked = min(whole, rollout.step_replicas + surge)
    state = rollout.model_copy(
        update={"stage": "Deploying", "step_replicas": asked, "attempt": rollout.attempt + 1, "targets": []}
    )
    message = (
        f"revision {rollout.revision}: {len(rollout.gated)}/{whole} pods gated; {asked} asked, revision "
        f"{active} down to {serving_wanted(world, state)}"
    )
    return state, (Event("Normal", "SteppedUp", message),)


def gateway_and_serving(world: World, rollout: RolloutState, active: str) -> tuple[str | None, int | None]:
    """What the gateway is rendered for (None: left as it is) and the serving revision's pods (None:
    left as they are) while `rollout` is under way."""
    candidate = rollout.revision
    gateway_now = world.gateway.revision if world.gateway is not None else ""
    if rollout.stage == "Promoting":
        gateway: str | None = candidate
    elif is_mixing(rollout):
        gateway = mixed(active, candidate)
    elif "+" in gateway_now and active:  # blocked, or the spec moved on: back onto the serving revision
        gateway = active
    else:
        gateway = None
    serving = world.workers.get(active) if active else None
    if serving is None or world.spec.autoscaling.enabled:
        return gateway, None
    is_stepping = is_mixing(rollout) or (rollout.stage == "Promoting" and rollout.step_replicas is not None)
    if is_stepping:
        wanted = serving_wanted(world, rollout)
    elif rollout.step_replicas is not None:  # back to its size as room is made; never scaled down here
        candidate_pods = world.workers[candidate].replicas if candidate in world.workers else 0
        free = room(world, rollout, active) - candidate_pods
        wanted = max(serving.replicas, min(world.spec.worker.replicas, free))
    else:  # back to its size, if a stepwise rollout left it smaller; never scaled down here
        wanted = max(serving.replicas, world.spec.worker.replicas)
    return gateway, wanted if wanted != serving.replicas else None
