"""`spec.trafficClasses`: how the gateway classes requests (interactive or bulk) and how the workers
serve the two classes (docs/scheduling.md). Part of the `EmbeddingModel` spec (spec.py builds on it);
WORKER_CLASS_FIELDS are the fields the workers read, part of the revision (revision.py).
"""

from __future__ import annotations

from pydantic import Field, model_validator

from kembed.operator.spec.spec_base import SpecModel

__all__ = [
    "MAX_BULK_GATEWAY_REPLICAS",
    "MAX_BULK_TOKENIZATION_PROCESSES",
    "WORKER_CLASS_FIELDS",
    "BulkGatewaySpec",
    "TrafficClassesSpec",
]

# Children per gateway process. Each holds its own tokenizer (~100 MB for BGE-M3's) and wants a core;
# past a few, the parent's one event loop (HTTP, JSON, chunking) is what bulk waits for.
MAX_BULK_TOKENIZATION_PROCESSES = 16
# Bulk gateway pods: a bound against a typo, well above what indexing clients need; each pod holds
# a gateway's CPU and memory.
MAX_BULK_GATEWAY_REPLICAS = 64


class BulkGatewaySpec(SpecModel):
    """A second gateway Deployment and Service (`<model>-gateway-bulk`) for indexing traffic: the same
    pods as the main gateway's, under a component label of their own."""

    replicas: int = Field(
        1,
        ge=1,
        le=MAX_BULK_GATEWAY_REPLICAS,
        description="Bulk gateway pods, from 1 to 64; each takes what a gateway pod takes "
        "(gateway.resources). 1 by default: a rolling update starts the new pod first, and indexing "
        "clients retry through a node drain. Fixed: gateway.autoscaling scales the main gateway only.",
    )


class TrafficClassesSpec(SpecModel):
    """Interactive requests before bulk ones: how the gateway classes requests, and how the workers
    share their batches and their queue between the two classes (worker/scheduling/queues.py)."""

    enabled: bool = Field(
        True,
        description="Serve interactive requests before bulk ones. Off: each worker keeps one "
        "first-come-first-served queue (round robin across requests) and the gateway admits bulk as "
        "it admits interactive requests. On by default: without it a query behind an indexing backlog "
        "waits for all of it. Workers: KEMBED_WORKER_PRIORITY_CLASSES; gateway: "
        "KEMBED_GATEWAY_PRIORITY_CLASSES.",
    )
    interactive_max_inputs: int = Field(
        8,
        ge=0,
        le=4096,
        description="A request without an X-Kembed-Priority header is interactive when it has at most "
        "this many inputs and at most interactiveMaxTokens tokens, bulk otherwise. 8: a search query "
        "with a few rewrites; 0: only requests whose header says interactive are. Gateway: "
        "KEMBED_GATEWAY_INTERACTIVE_MAX_INPUTS.",
    )
    interactive_max_tokens: int = Field(
        1024,
        ge=0,
        description="Token limit of an interactive request without the header, in tokens, all its "
        "inputs together (see interactiveMaxInputs). 1024: two 512-token passages. Gateway: "
        "KEMBED_GATEWAY_INTERACTIVE_MAX_TOKENS.",
    )
    bulk_queue_share: float = Field(
        0.75,
        ge=0.1,
        le=1.0,
        description="Share of a worker's queue (worker.maxQueuedTokens) that bulk may fill, from 0.1 to "
        "1. Past it the workers refuse bulk and the gateway answers bulk requests 429 with Retry-After, "
        "while interactive requests are admitted up to the whole queue: when the fleet fills with "
        "indexing, queries still get in. One value for both, so they agree. At least 0.1: less leaves "
        "bulk too little queue to keep a GPU busy (0.1 of the default 65536 tokens is three 2048-token "
        "batches). Workers: KEMBED_WORKER_BULK_QUEUE_SHARE; gateway: KEMBED_GATEWAY_BULK_QUEUE_SHARE.",
    )
    bulk_step_tokens: int = Field(
        0,
        ge=0,
        description="Most bulk tokens in one forward pass while interactive traffic is about (a query "
        "waiting, or one seen in the last interactiveHoldSeconds), in tokens; 0 means half of "
        "worker.maxBatchTokens, and it may not exceed worker.maxBatchTokens. A query that arrives "
        "waits for the steps already launched, so their length is its wait: on an H200 a BGE-M3-class "
        "step of 4096 tokens takes ~5 ms against ~10 ms for 8192, at ~97% of the throughput. Workers: "
        "KEMBED_WORKER_BULK_STEP_TOKENS.",
    )
    interactive_hold_seconds: float = Field(
        1.0,
        ge=0.0,
        le=60.0,
        description="How long after the last interactive request bulk steps stay short "
        "(bulkStepTokens), in seconds, from 0 to 60: queries come in streams, and the step in flight "
        "when the next one arrives was launched before it. 0: only while a query is waiting. Workers: "
        "KEMBED_WORKER_INTERACTIVE_HOLD_S.",
    )
    bulk_max_wait_seconds: float = Field(
        0.5,
        ge=0.0,
        le=60.0,
        description="Bulk that has waited this long without a sequence launched goes first in the next "
        "step (up to bulkStepTokens), in seconds, from 0 to 60: interactive traffic that fills every "
        "step cannot starve indexing. 0: waiting bulk takes up to bulkStepTokens of every step. "
        "Workers: KEMBED_WORKER_BULK_MAX_WAIT_S.",
    )
    interactive_lane: bool = Field(
        True,
        description="On CUDA workers, while bulk keeps the GPU busy, run interactive batches on a "
        "second, high-priority stream with graphs of their own, beside the bulk steps instead of "
        "behind them; bulk then runs in full steps (bulkStepTokens and interactiveHoldSeconds no longer "
        "apply). On an H200 (BGE-M3 shape, 16 query clients beside 4 indexing clients) it halved a "
        "query's time in the worker (~10 ms to ~5.5 ms mean) for 1-4 points of bulk throughput against "
        "the classes off. Not with the flashinfer attention backend (it plans each batch into one "
        "workspace). Workers: KEMBED_WORKER_INTERACTIVE_LANE.",
    )
    lane_inflight_batches: int = Field(
        2,
        ge=1,
        le=8,
        description="Interactive batches on the lane at once (interactiveLane), from 1 to 8. Each lane "
        "step costs bulk GPU time whatever its size, so fewer, fuller steps leave bulk more: on an H200 "
        "(BGE-M3 shape, 16 query clients beside 4 indexing clients) 1 kept 89-90% of bulk's throughput "
        "against 86-89% with 2, and a query spent ~1.5 ms more in the worker (7.1 against 5.6 ms). "
        "Workers: KEMBED_WORKER_LANE_INFLIGHT_BATCHES.",
    )
    bulk_tokenization_processes: int = Field(
        0,
        ge=0,
        le=MAX_BULK_TOKENIZATION_PROCESSES,
        description="Child processes per gateway process that tokenize the texts of bulk requests, off "
        "the process that serves HTTP, so that a query does not wait behind an indexing request's "
        "tokenizing; the ids are the same. 0 (the default, the gateway's own): bulk is tokenized on the "
        "gateway's threads like the rest. Raise it (1 or 2) where the gateway's queries slow down beside "
        "indexing and the nodes have cores to spare: on a 2-core machine it raised bulk throughput "
        "beside queries but did not lower a query's latency, as the cores were what was short. The "
        "gateway pod's CPU request is at least gateway.processes x (1 + this) cores (a lower "
        "resources.requests.cpu is raised to it); each child holds its own copy of the tokenizer "
        "(~100 MB for BGE-M3's), so give memory to match. From 0 to 16; needs enabled (with the classes "
        "off no request is bulk). Rolls the gateway only. Gateway: "
        "KEMBED_GATEWAY_BULK_TOKENIZATION_PROCESSES.",
    )
    bulk_gateway: BulkGatewaySpec | None = Field(
        None,
        description="A gateway of its own for bulk traffic: a second gateway Deployment and Service, "
        "<model>-gateway-bulk, with the main gateway's pod template (image, environment, resources, "
        "probes) and Service type and port, and its own PodDisruptionBudget, NetworkPolicy and "
        "ServiceMonitor where the main gateway has them; status.bulkGatewayURL is its URL. Point "
        "indexing and re-indexing jobs at it; queries stay on the main Service, <model>-gateway. "
        "Requests there are classed by the same rules (the header, else the size). It takes bulk's "
        "HTTP, JSON and tokenizing off the event loop the queries wait on (on an H200, 16 query clients "
        "beside 4 indexing clients: query p99 18.7-21.8 ms instead of 23.3 ms, bulk throughput alike). "
        "Costs one more gateway pod per replica. Unset (the default), one gateway serves both; "
        "removing it deletes the bulk gateway's objects. Needs enabled. Not part of the revision: "
        "setting or removing it never rolls the workers.",
    )

    @model_validator(mode="after")
    def _bulk_processes_need_classes(self) -> TrafficClassesSpec:
        if self.bulk_tokenization_processes and not self.enabled:
            raise ValueError(
                "bulkTokenizationProcesses needs enabled: with the classes off no request is bulk"
            )
        return self

    @model_validator(mode="after")
    def _bulk_gateway_needs_classes(self) -> TrafficClassesSpec:
        if self.bulk_gateway is not None and not self.enabled:
            raise ValueError("bulkGateway needs enabled: with the classes off no request is bulk")
        return self


# The fields the workers read: part of the revision (revision.py) and of its ConfigMap.
WORKER_CLASS_FIELDS = frozenset(
    {
        "enabled",
        "bulk_queue_share",
        "bulk_step_tokens",
        "interactive_hold_seconds",
        "bulk_max_wait_seconds",
        "interactive_lane",
        "lane_inflight_batches",
    }
)
