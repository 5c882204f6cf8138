"""What a loaded model is, and what its engine has done so far: plain records, free of torch and gRPC."""

from collections.abc import Mapping
from dataclasses import dataclass, field

# Why a step ran eagerly (`EngineStats.eager_steps`' keys, the metric's `reason` label): first hit
# (lazy), fits no bucket, no graphs, graph cap reached, no captured bucket holds it after prewarm
COLD, UNCAPTURABLE, DISABLED, FULL, UNCOVERED = "cold", "uncapturable", "disabled", "full", "uncovered"
EAGER_REASONS = (COLD, UNCAPTURABLE, DISABLED, FULL, UNCOVERED)


@dataclass(frozen=True)
class ModelInfo:
    """Facts about the served model and the engine's resolved choices (see `proto` InfoResponse)."""

    model_name: str
    model_type: str  # config.json model_type, e.g. "bert"
    task: str  # "embed" or "score"
    dimensions: int  # pooled vector size
    max_sequence_length: int  # longest sequence the position table allows, in tokens
    vocab_size: int  # ids must be < this
    pooling: str  # "cls" | "mean" | "last"
    normalize: bool  # the sentence-transformers pipeline ends in Normalize
    dtype: str
    device: str
    attention_backend: str
    outputs: int = 0  # the Output kinds served (kembed.proto.outputs bitmask); 0 for scorers
    colbert_dimensions: int = 0  # COLBERT vectors' size (0: none)
    hidden_size: int = 0  # TOKENS vectors' size (0: none)
    sparse_vocabulary: bool = False  # SPARSE alone, vocabulary-indexed (SPLADE): worker/edge/vocabulary.py
    # Which model this is, as the gateway checks it (kembed.proto.model_identity): "sha256:<hex>"
    # each; tokenizer "" without a tokenizer.json, model "" without weight files
    tokenizer_digest: str = ""
    model_digest: str = ""
    tasks: tuple[str, ...] = ()  # task adapters, each request's pick (jina-embeddings-v3); () for none
    default_task: str = ""  # the adapter a request naming none gets ("": the base weights)


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the engine's own counters and memory, read at scrape time by the metrics
    collector (worker/metrics.py). Counters count since start; an eager engine reports no graphs."""

    pinned_in_use_bytes: int = 0  # pinned ring slots holding a batch in flight
    pinned_reserved_bytes: int = 0  # pinned ring slots allocated (in use or free)
    gpu_memory_bytes: int = 0  # device memory held by torch's caching allocator (graph pool included)
    num_captures: int = 0  # CUDA graphs captured (lazily or by prewarm)
    capture_seconds: tuple[float, ...] = ()  # duration of each capture, in order
    num_replays: int = 0  # steps that replayed a captured graph
    num_graphs_resident: int = 0  # captured graphs held now
    eager_steps: Mapping[str, int] = field(default_factory=dict)  # eager steps by reason (EAGER_REASONS)
    # captures made inside a step, on the serving path (the lazy policy's second hits); stays 0 on a
    # worker that prewarmed at start, whose captures happen at start and when idle
    num_serving_captures: int = 0
    # batches per bucket (SEQSxTOKENS, the batch's own bucket, before any pad-up) since start, only
    # buckets hit at least once: what the operator reads to keep the hot list current
    bucket_hits: Mapping[str, int] = field(default_factory=dict)
