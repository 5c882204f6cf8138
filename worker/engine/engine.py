"""The eager engine: pack a ragged batch, run the encoder and pooling, hand back a LazyTensor at once;
and `load_engine`, which builds the engine a configuration asks for.

This is the eager path shared by CPU and GPU. The GPU engine (CUDA graphs per padded bucket,
varlen attention kernels, a pinned result ring under a byte cap) writes `pack` and `step` its own
way behind the same `BaseEngine` (base.py).
"""

import dataclasses
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kembed.proto.model_files import load_model_spec
from kembed.proto.model_identity import ModelIdentity, read_identity
from kembed.worker.buckets import Bucket, BucketTable
from kembed.worker.config import WorkerConfig
from kembed.worker.engine.attention_choice import RoutedAttention, choose_attention
from kembed.worker.engine.base import BaseEngine
from kembed.worker.engine.cuda_engine import CudaEngine
from kembed.worker.engine.graphs import CapturePolicy
from kembed.worker.engine.kernels.fp8 import fp8_unsupported_reason, quantize_linears
from kembed.worker.engine.layers.attention import (
    Attention,
    AttentionMetadata,
    AttentionShape,
    FlashInferAttention,
    build_metadata,
)
from kembed.worker.engine.layers.attention_backends import (
    ATTENTION_BACKENDS,
    cuda_backends,
    window_refusal,
)
from kembed.worker.engine.lazy import LazyTensor, to_host
from kembed.worker.engine.models.families import attention_shape, build_model
from kembed.worker.engine.models.model_dir import ModelDir, read_model_dir
from kembed.worker.engine.models.served import ServedModel
from kembed.worker.engine.payload import PayloadIndex, assemble
from kembed.worker.engine.spans import SpanIndex, forward_spans
from kembed.worker.engine.staging import pad_batch
from kembed.worker.errors import StartupError
from kembed.worker.info import ModelInfo

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

CPU_TOKEN_MULTIPLE = 64
"""On a CPU a batch's token count is padded up to a multiple of this (one extra sequence, its row
dropped). Every activation of an eager step is a fresh malloc (torch's CPU allocator caches
nothing) sized by the token count. With every count possible, glibc serves them from its heaps once
its mmap threshold has risen past them, and they leave holes of sizes never asked for again: under
`make soak` the bytes in use stayed ~160 MB while the free bytes glibc held grew 180 -> 800 MB and
RSS 403 MB -> 1.2 GB in five minutes, still rising (docs/reliability.md). Multiples of
64 give 32 sizes up to the 2048-token budget, whose blocks are reused, and cost at most 63 tokens
more per batch (2 % more step CPU; a fixed mmap threshold instead cost 15-30 %, for the page
faults of mapping every activation afresh: tests/soak/malloc_options.py)."""


@dataclass(frozen=True)
class PackedBatch:
    """One batch ready for the device: packed ids and the attention metadata, on the host."""

    input_ids: torch.Tensor  # [num_tokens] int64
    position_ids: torch.Tensor  # [num_tokens] int64
    token_type_ids: torch.Tensor  # [num_tokens] int64
    meta: AttentionMetadata
    bucket: Bucket | None  # the bucket the batch would pad to (hit counts), None if beyond all
    num_seqs: int  # rows the step returns: the batch's own (a CPU batch carries one padding sequence)
    spans: SpanIndex | None = None  # span pooling (spans.py): rows per span; None: one per sequence
    payload: PayloadIndex | None = None  # several outputs a sequence (payload.py); None: dense rows


class Engine(BaseEngine[PackedBatch]):
    """Runs one model eagerly on one device (the CPU path, and GPUs without a varlen backend).
    Not thread-safe: one launcher thread calls `step`.

    It pads no batch to a bucket when serving (a CPU batch's token count only to a multiple of
    CPU_TOKEN_MULTIPLE, for the heap's sake), but counts bucket hits like the CUDA engine so the
    operator's hot-bucket flow works on any worker, and its smoke test runs each bucket padded
    against the same batch unpadded, which checks the padding layout that CUDA graphs rely on.
    Nothing is captured: stats read 0 for the pinned ring and graphs, and every step is eager with
    reason "disabled"."""

    def __init__(
        self, model: ServedModel, info: ModelInfo, device: torch.device, buckets: BucketTable
    ) -> None:
        super().__init__(model, info, device, buckets, CapturePolicy(max_graphs=0, is_enabled=False))
        self._prewarmed: set[Bucket] = set()

    def pack(
        self,
        token_ids: np.ndarray,
        lengths: np.ndarray,
        token_type_ids: np.ndarray | None = None,
        spans: Sequence[np.ndarray | None] | None = None,
        outputs: np.ndarray | None = None,
    ) -> PackedBatch:
        """Host tensors for a ragged batch (`BaseEngine.pack`)."""
        span_index = None if spans is None else SpanIndex.build(lengths, spans)
        num_seqs = len(lengths)
        real_lengths = lengths
        bucket = self.buckets.lookup(num_seqs, int(lengths.sum()))
        if self.device.type == "cpu":
            token_ids, lengths, token_type_ids = _pad_tokens(token_ids, lengths, token_type_ids)
        payload = None
        if outputs is not None:
            facts = self.model.facts
            payload = PayloadIndex.build(
                real_lengths, outputs, facts.output_shape, facts.outputs, len(lengths), int(lengths.sum())
            )
        meta, host_positions = build_metadata(lengths)
        input_ids = torch.from_numpy(token_ids.astype(np.int64))
        types = (
            torch.zeros_like(input_ids)
            if token_type_ids is None
            else torch.from_numpy(token_type_ids.astype(np.int64))
        )
        positions = torch.from_numpy(host_positions)
        if self.device.type == "cuda":  # pinned so the copy to the device is truly asynchronous
            input_ids, positions, types = input_ids.pin_memory(), positions.pin_memory(), types.pin_memory()
        return PackedBatch(input_ids, positions, types, meta, bucket, num_seqs, span_index, payload)

    @torch.inference_mode()
    def step(self, batch: PackedBatch) -> LazyTensor:
        """Launch the forward pass of `batch`; return its pooled vectors [num_seqs, dimensions] lazily."""
        self.policy.decide(batch.bucket)  # counts the hit; eager, reason "disabled"
        return self._launch(batch)

    def _launch(self, batch: PackedBatch) -> LazyTensor:
        device = self.device
        meta = batch.meta.to(device)
        inputs = (
            batch.input_ids.to(device, non_blocking=True),
            batch.position_ids.to(device, non_blocking=True),
            batch.token_type_ids.to(device, non_blocking=True),
            meta,
        )
        if batch.payload is not None:  # every output asked for, from one pass
            return to_host(assemble(self.model.forward_outputs(*inputs), batch.payload))
        if batch.spans is None:
            pooled = self.model(*inputs)[: batch.num_seqs]
        else:  # the same eager forward, pooled per span (spans.py)
            pooled = forward_spans(self.model, *inputs, batch.spans)
        return to_host(pooled)

    def captured_buckets(self) -> list[Bucket]:
        return sorted(self._prewarmed)

    def prewarm(self, buckets: list[Bucket]) -> list[Bucket]:
        """Nothing to capture without CUDA graphs: records the buckets so a smoke test covers them."""
        self._prewarmed.update(buckets)
        return list(buckets)

    def prewarm_at_start(
        self, prewarm: str | Sequence[Bucket], hot: Sequence[Bucket], max_seconds: float
    ) -> None:
        """Nothing to capture without CUDA graphs (the CUDA engine's start-up prewarm). The buckets
        it was given by name (`hot`, and a listed `prewarm`) are recorded as `prewarm` records them,
        so stats and a smoke test cover them as they would on a GPU; `none` records nothing."""
        recorded = self.prewarm([] if prewarm == "none" else self.named_buckets(prewarm, hot))
        log.info(
            "prewarm: none (no CUDA graphs on the %s eager engine); %d named buckets recorded",
            self.device,
            len(recorded),
        )

    @torch.inference_mode()
    def compare(self, token_ids: np.ndarray, lengths: np.ndarray) -> tuple[Bucket, np.ndarray, np.ndarray]:
        """(bucket, rows run unpadded, rows run padded to the bucket): the smoke test's pair."""
        reference = self._launch(self.pack(token_ids, lengths)).wait()  # not counted as a hit
        bucket = self.buckets.lookup(len(lengths), int(lengths.sum()))
        padded = pad_batch(token_ids, lengths, None, bucket)
        meta = AttentionMetadata(
            cu_seqlens=torch.from_numpy(padded.cu_seqlens),
            max_seqlen=padded.bucket.num_tokens,
            seq_ids=torch.from_numpy(padded.seq_ids),
            pad_index=None,
            unpad_index=None,
            key_mask=None,
            host_cu_seqlens=tuple(padded.cu_seqlens.tolist()),
        )
        device = self.device
        rows = self.model(
            torch.from_numpy(padded.input_ids).to(device),
            torch.from_numpy(padded.position_ids).to(device),
            torch.from_numpy(padded.token_type_ids).to(device),
            meta.to(device),
        )
        return padded.bucket, reference, rows[: len(lengths)].float().cpu().numpy()


def _pad_tokens(
    token_ids: np.ndarray, lengths: np.ndarray, token_type_ids: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The batch plus one sequence of zeros that brings its token count to a multiple of
    CPU_TOKEN_MULTIPLE (unchanged if it is one). Attention is per sequence, so the others' rows are
    what they would be without it."""
    num_pad = -int(lengths.sum()) % CPU_TOKEN_MULTIPLE
    if num_pad == 0:
        return token_ids, lengths, token_type_ids
    token_ids = np.concatenate([token_ids, np.zeros(num_pad, token_ids.dtype)])
    if token_type_ids is not None:
        token_type_ids = np.concatenate([token_type_ids, np.zeros(num_pad, token_type_ids.dtype)])
    return token_ids, np.append(lengths, num_pad).astype(lengths.dtype), token_type_ids


def _identity(path: Path) -> ModelIdentity:
    """The model directory's digests; its tokenizer's "" when it has no tokenizer.json (the gateway
    then cannot check it and says so)."""
    try:
        spec = load_model_spec(path)
    except (OSError, ValueError) as error:  # no tokenizer.json, or its settings unreadable
        log.warning("model %s: no tokenizer digest, gateways cannot check its tokenizer (%s)", path, error)
        spec = None
    return read_identity(path, spec)


def load_engine(config: WorkerConfig) -> BaseEngine[Any]:
    """Read the model directory, build the encoder on the configured device and dtype; the CUDA engine
    on a GPU with a varlen attention backend, else the eager one."""
    started = time.perf_counter()
    device = _resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    if config.linear_dtype == "fp8":
        reason = fp8_unsupported_reason(device)
        if reason is not None:
            raise StartupError(f"--linear-dtype fp8: {reason}")
        if dtype != torch.bfloat16:
            raise StartupError(f"--linear-dtype fp8 computes in bfloat16 around its GEMMs, not {dtype}")
    if device.type == "cpu" and config.num_threads > 0:
        torch.set_num_threads(config.num_threads)
    model_dir = read_model_dir(config.model)
    # The digests the gateway checks (hashing the weights: ~1 GB/s a core) beside the model's load.
    hashing = ThreadPoolExecutor(1, thread_name_prefix="kembed-model-digest")
    identity = hashing.submit(_identity, model_dir.path)
    hashing.shutdown(wait=False)
    if config.pooling:  # the deployment's overrides of the model's own pipeline
        model_dir = dataclasses.replace(
            model_dir, pooling={"lasttoken": "last"}.get(config.pooling, config.pooling)
        )
    if config.normalize is not None:
        model_dir = dataclasses.replace(model_dir, normalize=config.normalize)
    if config.adapter:
        model_dir = dataclasses.replace(model_dir, adapter=config.adapter)
    # Probed up to the configured budget; a longer single sequence takes the last range's backend.
    backend, attend, is_varlen = _resolve_attention(
        config.attention_backend, model_dir, device, dtype, config.max_batch_tokens
    )
    model = build_model(model_dir, attend).to(device=device, dtype=dtype).eval()
    dtype_name = str(dtype).removeprefix("torch.")
    if config.linear_dtype == "fp8":
        try:
            num_fp8 = quantize_linears(model)  # after the move: quantised on the device, in bf16
        except ValueError as exc:
            raise StartupError(f"--linear-dtype fp8: {exc}") from None
        if num_fp8 == 0:  # a family without an fp8 path (its layers name no FP8_LINEARS)
            raise StartupError(f"--linear-dtype fp8: model_type {model_dir.model_type!r} has no fp8 path")
        dtype_name += "+fp8"
        log.warning(
            "linear dtype fp8: %d encoder linears in float8 e4m3 (below kembed's cosine 0.999 bar)", num_fp8
        )
    facts = model.facts
    digests = identity.result()
    info = ModelInfo(
        model_name=config.served_model_name or model_dir.path.name,
        model_type=model_dir.model_type,
        task=facts.task,
        dimensions=facts.output_size,
        max_sequence_length=facts.max_sequence_length,
        vocab_size=facts.vocab_size,
        pooling=facts.pooling,
        normalize=model_dir.normalize,
        dtype=dtype_name,
        device=str(device),
        attention_backend=backend,
        outputs=facts.outputs,
        colbert_dimensions=facts.colbert_size,
        hidden_size=facts.hidden_size,
        sparse_vocabulary=facts.sparse_vocabulary,
        tokenizer_digest=digests.tokenizer,
        model_digest=digests.model,
    )
    log.info(
        "loaded %s (%s, %s) on %s as %s, attention %s, pooling %s, %s in %.1fs",
        model_dir.path,
        info.model_type,
        info.task,
        device,
        info.dtype,
        backend,
        info.pooling,
        digests.short(),
        time.perf_counter() - started,
    )
    # Any batch up to the larger of the token budget and the longest sequence (which runs alone);
    # several sequences only up to the budget.
    buckets = BucketTable(
        max(config.max_batch_tokens, facts.max_sequence_length),
        config.max_batch_sequences,
        max_batch_tokens=config.max_batch_tokens,
    )
    if device.type == "cuda" and is_varlen:
        engine = CudaEngine(
            model, info, device,
            buckets=buckets,
            max_graphs=config.max_graphs,
            use_graphs=config.cuda_graphs,
            inflight=config.max_inflight_batches,
            max_pinned_bytes=config.max_pinned_bytes,
            attention=attend,
        )  # fmt: skip
        lane = _interactive_lane(config, engine, attend)
        if lane is not None:
            engine.add_lane(lane)
        return engine
    return Engine(model, info, device, buckets)


def _interactive_lane(config: WorkerConfig, engine: CudaEngine, attend: Attention) -> CudaEngine | None:
    """The interactive lane (cuda_engine.py) the configuration asks for, or None (and why, logged)."""
    if not (config.interactive_lane and config.priority_classes):
        return None
    if attend.plans_batches:
        log.info("interactive lane: off (the attention backend plans each batch into one workspace)")
        return None
    tokens = min(config.lane_max_batch_tokens, config.max_batch_tokens)
    seqs = min(config.lane_max_batch_sequences, config.max_batch_sequences)
    # lower is higher: (0, -3) on an H200; a static method at run time, which torch's stub misses
    highest = torch.cuda.Stream.priority_range()[1]  # type: ignore[call-arg]
    lane = CudaEngine(
        engine.model, engine.info, engine.device,
        buckets=BucketTable(tokens, seqs, max_batch_tokens=tokens),
        max_graphs=config.max_graphs,
        use_graphs=config.cuda_graphs,
        inflight=config.lane_inflight_batches,
        max_pinned_bytes=config.max_pinned_bytes,
        attention=attend,
        stream=torch.cuda.Stream(device=engine.device, priority=highest),
    )  # fmt: skip
    log.info(
        "interactive lane: on (steps of up to %d sequences and %d tokens, stream priority %d)",
        seqs,
        tokens,
        highest,
    )
    return lane


def _resolve_attention(
    requested: str, model_dir: ModelDir, device: torch.device, dtype: torch.dtype, max_tokens: int
) -> tuple[str, Attention, bool]:
    """(what Info reports, the attention backend, whether it is a varlen kernel CUDA graphs replay).
    A model whose scores carry a relative-position bias gets only a backend that adds it, and one
    with a sliding window only a backend that serves it exactly (each said in the log); on a GPU where
    no varlen backend serves the model it runs on `sdpa-padded` in the eager engine, which is logged.
    A backend asked for by name that cannot serve the model refuses the start."""
    shape = attention_shape(model_dir)
    if device.type != "cuda":
        name = "sdpa" if requested == "auto" else requested  # per-sequence calls are cheap on a CPU
        if name not in ATTENTION_BACKENDS:
            raise StartupError(f"attention backend {requested!r} needs a CUDA device")
        return name, _serving(ATTENTION_BACKENDS[name], name, shape), False
    # auto never compiles flashinfer's kernels (minutes with nvcc): it times them only when built
    varlen = cuda_backends(device, shape, compile_kernels=requested == "flashinfer")
    if requested == "auto":
        if not varlen:
            log.warning(
                "attention: no varlen backend serves this model's attention (%s): the eager engine "
                "with sdpa-padded, no CUDA graphs",
                shape,
            )
            return "sdpa-padded", ATTENTION_BACKENDS["sdpa-padded"], False
        if len(varlen) == 1:
            name = next(iter(varlen))
            return name, varlen[name], True
        plan = choose_attention(varlen, shape, device, dtype, max_tokens)
        return plan.describe(), RoutedAttention(plan, varlen), True
    if requested in varlen:
        return requested, varlen[requested], True
    if requested in ATTENTION_BACKENDS:
        return requested, _serving(ATTENTION_BACKENDS[requested], requested, shape), False
    if shape.window is not None or shape.bias:  # left out for the model's attention? say why
        plain = cuda_backends(device, dataclasses.replace(shape, window=None, bias=""))
        if requested in plain:
            _serving(plain[requested], requested, shape)  # raises, naming what it lacks
    raise StartupError(
        f"attention backend {requested!r} is not available here for this model (usable: {sorted(varlen)}; "
        f"flashinfer has kernels for head sizes {FlashInferAttention.HEAD_DIMS} only)"
    )


def _serving(attend: Attention, name: str, shape: AttentionShape) -> Attention:
    """`attend`, if it adds the model's position bias and serves its sliding window exactly (or the
    model has neither); else StartupError."""
    if shape.bias and shape.bias not in attend.bias_kinds:
        raise StartupError(
            f"attention backend {name!r} adds no {shape.bias} position bias, which this model's attention "
            "needs (auto chooses one that does)"
        )
    if (reason := window_refusal(attend, shape)) is not None:
        raise StartupError(f"attention backend {name!r} cannot serve this model: {reason}")
    return attend


def _resolve_device(requested: str) -> torch.device:
    if requested == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        log.warning(
            "--device auto: torch %s sees no CUDA device, so the model runs on the CPU (pass --device cuda "
            "to refuse to start instead)",
            torch.__version__,
        )
        return torch.device("cpu")
    if requested == "cuda" and not torch.cuda.is_available():
        raise StartupError("--device cuda was asked for but torch sees no CUDA device")
    return torch.device(requested)


def resolve_dtype(requested: str, device: torch.device) -> torch.dtype:
    """The dtype a worker runs in: `requested`, or for `auto` bfloat16 on CUDA and float32 on a CPU."""
    if requested == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[requested]
