"""The typed `EmbeddingModel` status: what the operator observed and decided, written by `reconcile`
and read back on the next pass (a restarted operator resumes a rollout from it). Part of the CRD
schema (crd.py), like the spec.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from kembed.operator.spec.model_spec import ModelStatus
from kembed.operator.spec.spec_base import SpecModel

ConditionType = Literal[
    "Ready",
    "Progressing",
    "Prewarmed",
    "SmokeTestPassed",
    "RolloutBlocked",
    "Degraded",
    "Autoscaling",
    "ModelFetchFailed",
]
Phase = Literal["Pending", "Progressing", "Ready", "Degraded", "Blocked", "Invalid"]
Stage = Literal["Deploying", "Prewarming", "SmokeTesting", "Mixing", "Promoting", "Blocked"]


class Condition(SpecModel):
    """One observation, as in metav1.Condition."""

    type: ConditionType = Field(
        description="Ready, Progressing, Prewarmed, SmokeTestPassed, RolloutBlocked, Degraded or "
        "Autoscaling (with spec.autoscaling: False, reason KedaMissing, when the cluster serves no "
        "ScaledObject) or ModelFetchFailed (a huggingFace or s3 source: True naming the source, the file "
        "and the error, with reason Forbidden, NotFound, ChecksumMismatch, DiskFull, Refused, "
        "Unverified, SourceChanged or Unreachable)."
    )
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase reason, machine-readable.")
    message: str = Field("", description="What happened, for humans.")
    last_transition_time: str = Field(description="When status last changed (RFC 3339).")
    observed_generation: int = Field(0, description="metadata.generation this condition was set for.")


class RolloutState(SpecModel):
    """The rollout in flight, kept in status so a restarted operator resumes it where it was."""

    revision: str = Field(description="Candidate revision.")
    stage: Stage = Field(
        description="Deploying, Prewarming, SmokeTesting, Mixing (a stepwise rollout: the gateway moving "
        "onto both revisions' pods), Promoting or Blocked."
    )
    attempt: int = Field(
        1,
        description="The gate's run at this revision (a retry, a restarted pod, a stepwise rollout's "
        "step); part of the Job names.",
    )
    generation: int = Field(
        0,
        description="metadata.generation the attempt started at (or was blocked at).",
    )
    stage_started_at: str = Field(description="When the current stage began (RFC 3339), for timeouts.")
    targets: list[str] = Field(
        default_factory=list,
        description="Candidate pod addresses the prewarm Job captured on; a change means prewarming again.",
    )
    spec_hash: str = Field(
        "",
        description="Hash of the spec a blocked rollout was blocked on, worker.replicas left out: it is "
        "retried when the spec changes otherwise, not when it is only scaled.",
    )
    reason: str = Field("", description="Why the rollout is blocked (empty otherwise).")
    message: str = Field("", description="Details of the block.")
    step_replicas: int | None = Field(
        None,
        description="A stepwise rollout (rollout.maxSurgeReplicas): the candidate's pods in this step. "
        "Unset: all of them at once.",
    )
    gated: list[str] = Field(
        default_factory=list,
        description="A stepwise rollout: the candidate's pods that passed the gate in earlier steps "
        "(targets are this step's new ones).",
    )
    image_digest: str = Field(
        "",
        description="The worker image's digest the candidate's pods run (sha256:...), read from their "
        "status when they became ready; empty where the runtime reports none.",
    )
    replicas: int | None = Field(
        None,
        description="Worker pods the candidate runs through the gate under autoscaling: the serving "
        "revision's count when the rollout started (at least 1, within autoscaling's min and max), kept "
        "so the autoscaler's moves do not change the gated pods. Unset without autoscaling "
        "(worker.replicas).",
    )


class EmbeddingModelStatus(SpecModel):
    """What the operator observed and decided."""

    observed_generation: int = Field(0, description="metadata.generation last reconciled.")
    phase: Phase = Field("Pending", description="Pending, Progressing, Ready, Degraded, Blocked or Invalid.")
    conditions: list[Condition] = Field(default_factory=list, description="Current conditions, one per type.")
    active_revision: str = Field("", description="Revision the gateway serves from.")
    candidate_revision: str = Field("", description="Revision being rolled out (empty when none).")
    replicas: int = Field(0, description="Desired workers of the serving revision (the scale subresource).")
    ready_replicas: int = Field(0, description="Ready workers of the serving revision.")
    selector: str = Field("", description="Label selector of the serving workers (the scale subresource).")
    gateway_url: str = Field("", alias="gatewayURL", description="In-cluster URL of the gateway.")
    bulk_gateway_url: str | None = Field(
        None,
        alias="bulkGatewayURL",
        description="In-cluster URL of the bulk gateway (spec.trafficClasses.bulkGateway), for indexing "
        "jobs; absent without one.",
    )
    active_image_digest: str = Field(
        "",
        description="The worker image's digest the serving revision passed its gate with (empty if unknown).",
    )
    active_image_pinned: bool = Field(
        False,
        description="Whether the serving revision's Deployment runs the gated digest instead of the spec's "
        "tag: set when a serving pod ran another digest (the tag moved).",
    )
    rollout: RolloutState | None = Field(None, description="The rollout in flight, if any.")
    model: ModelStatus | None = Field(
        None, description="What a huggingFace or s3 source resolved to, and what is served."
    )


def parse_status(raw: dict[str, Any] | None) -> EmbeddingModelStatus:
    """A body's status; an unreadable one (e.g. written by another version) counts as empty."""
    try:
        return EmbeddingModelStatus.model_validate(raw or {})
    except ValueError:
        return EmbeddingModelStatus()


def dump(model: BaseModel) -> dict[str, Any]:
    """camelCase JSON-ready dict, unset optionals left out."""
    return model.model_dump(by_alias=True, exclude_none=True, mode="json")
