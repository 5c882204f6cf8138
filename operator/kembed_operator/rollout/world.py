"""What the rollout state machine (rollout.py) decides on and what it decides: the observed world and
the plan, plain frozen records, free of API calls."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from kembed.operator.build.jobs import JobRequest
from kembed.operator.rollout.golden import GoldenRecord
from kembed.operator.spec.spec import EmbeddingModelSpec
from kembed.operator.spec.status import EmbeddingModelStatus


@dataclass(frozen=True)
class Workers:
    """One revision's worker Deployment, as observed."""

    replicas: int  # desired
    addresses: tuple[str, ...]  # ready pods' host:port, sorted
    image_digests: frozenset[str] = frozenset()  # the worker image digests its ready pods run (sha256:...)

    @property
    def num_ready(self) -> int:
        return len(self.addresses)


@dataclass(frozen=True)
class JobState:
    phase: Literal["Running", "Succeeded", "Failed"]
    message: str = ""


@dataclass(frozen=True)
class Gateway:
    revision: str  # the revision its pod template points at
    is_rolled_out: bool  # every gateway pod runs the current template and is available
    num_ready: int
    # every revision a gateway pod (of any gateway of the model, any template) points at, and the
    # templates' own: none of them is deleted (`decide`)
    in_use: frozenset[str] = frozenset()


JobKey = tuple[str, str, int]  # (kind, revision, attempt)


@dataclass(frozen=True)
class World:
    """Everything the decision depends on; built by `reconcile` from the API server."""

    spec: EmbeddingModelSpec
    generation: int
    revision: str  # what the spec asks for
    now: datetime
    workers: Mapping[str, Workers] = field(default_factory=dict)
    jobs: Mapping[JobKey, JobState] = field(default_factory=dict)
    gateway: Gateway | None = None
    is_autoscaler_missing: bool = False  # autoscaling asked for, and the cluster serves no ScaledObject
    # golden Jobs that passed with an answer to keep once the whole gate passes (golden.py's judge)
    golden_records: Mapping[JobKey, GoldenRecord] = field(default_factory=dict)


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class Plan:
    """What must exist afterwards. `reconcile` creates what is missing and deletes the rest."""

    status: EmbeddingModelStatus
    revisions: frozenset[str]  # worker revisions kept; the others are deleted
    deploy: str | None  # revision whose workers are rendered from the current spec
    gateway: str | None  # revision the gateway is rendered for; None leaves it as it is
    jobs: tuple[JobRequest, ...] = ()  # rollout Jobs that must exist
    keep_jobs: frozenset[JobKey] = frozenset()  # finished Jobs kept (logs of a block); others deleted
    events: tuple[Event, ...] = ()
    # Pods asked of `deploy`'s Deployment; None leaves the field to the autoscaler (spec.autoscaling).
    worker_replicas: int | None = None
    autoscaled: str | None = None  # revision whose ScaledObject must exist; every other one is deleted
    golden: GoldenRecord | None = None  # a golden answer to keep (the candidate passed its whole gate)
    golden_revision: str = ""  # the revision it is recorded from
    golden_at: str = ""  # and when (RFC 3339): the oldest records go first
    # `deploy`'s worker image named by this digest instead of the spec's tag (status.activeImagePinned)
    worker_image_digest: str = ""
    # Pods asked of the serving revision's Deployment while a stepwise rollout shrinks it (and when it
    # ends without promoting: back to its size); None leaves it as it is.
    serving_replicas: int | None = None
