"""The engine: pack a ragged batch, run the encoder and pooling, hand back a LazyTensor at once.

This is the eager path shared by CPU and GPU. The GPU engine (lazy CUDA graphs per padded bucket,
varlen attention kernels, a pinned result ring under a byte cap) replaces `step`'s body behind the
same two calls, `pack` and `step`.
"""

import logging
import time
from dataclasses import dataclass

import numpy as np
import torch

from kembed.worker.config import WorkerConfig
from kembed.worker.engine.attention import ATTENTION_BACKENDS, AttentionMetadata, build_metadata
from kembed.worker.engine.lazy import LazyTensor
from kembed.worker.engine.model_dir import read_model_dir
from kembed.worker.engine.models import ServedModel, build_model
from kembed.worker.info import ModelInfo

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class PackedBatch:
    """One batch ready for the device: packed ids and the attention metadata, on the host."""

    input_ids: torch.Tensor  # [num_tokens] int64
    position_ids: torch.Tensor  # [num_tokens] int64
    token_type_ids: torch.Tensor  # [num_tokens] int64
    meta: AttentionMetadata


class Engine:
    """Runs one model on one device. Not thread-safe: one launcher thread calls `step`."""

    def __init__(self, model: ServedModel, info: ModelInfo, device: torch.device) -> None:
        self.model = model
        self.info = info
        self.device = device

    def pack(self, token_ids: np.ndarray, lengths: np.ndarray, token_type_ids: np.ndarray | None = None):
        """Build host tensors for a ragged batch: `token_ids` [num_tokens] int32, `lengths` [num_seqs]."""
        meta, positions = build_metadata(lengths)
        input_ids = torch.from_numpy(token_ids.astype(np.int64))
        types = (
            torch.zeros_like(input_ids)
            if token_type_ids is None
            else torch.from_numpy(token_type_ids.astype(np.int64))
        )
        batch = PackedBatch(input_ids, torch.from_numpy(positions), types, meta)
        if self.device.type == "cuda":  # pinned so the copy to the device is truly asynchronous
            batch = PackedBatch(
                batch.input_ids.pin_memory(),
                batch.position_ids.pin_memory(),
                batch.token_type_ids.pin_memory(),
                batch.meta,
            )
        return batch

    @torch.inference_mode()
    def step(self, batch: PackedBatch) -> LazyTensor:
        """Launch the forward pass of `batch`; return its pooled vectors [num_seqs, dimensions] lazily."""
        device = self.device
        meta = batch.meta.to(device)
        pooled = self.model(
            batch.input_ids.to(device, non_blocking=True),
            batch.position_ids.to(device, non_blocking=True),
            batch.token_type_ids.to(device, non_blocking=True),
            meta,
        )
        if device.type != "cuda":
            return LazyTensor(pooled, None)
        host = torch.empty(pooled.shape, dtype=torch.float32, pin_memory=True)
        host.copy_(pooled, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return LazyTensor(host, event, keepalive=(pooled,))


def load_engine(config: WorkerConfig) -> Engine:
    """Read the model directory, build the encoder on the configured device and dtype."""
    started = time.perf_counter()
    device = _resolve_device(config.device)
    dtype = _resolve_dtype(config.dtype, device)
    backend = config.attention_backend
    if backend == "auto":  # per-sequence calls are cheap on a CPU, kernel launches per sequence are not
        backend = "sdpa-padded" if device.type == "cuda" else "sdpa"
    if device.type == "cpu" and config.num_threads > 0:
        torch.set_num_threads(config.num_threads)
    model_dir = read_model_dir(config.model)
    model = build_model(model_dir, ATTENTION_BACKENDS[backend]).to(device=device, dtype=dtype).eval()
    facts = model.facts
    info = ModelInfo(
        model_name=config.served_model_name or model_dir.path.name,
        model_type=model_dir.model_type,
        task=facts.task,
        dimensions=facts.output_size,
        max_sequence_length=facts.max_sequence_length,
        vocab_size=facts.vocab_size,
        pooling=model_dir.pooling,
        normalize=model_dir.normalize,
        dtype=str(dtype).removeprefix("torch."),
        device=str(device),
        attention_backend=backend,
    )
    log.info(
        "loaded %s (%s, %s) on %s as %s, attention %s, pooling %s in %.1fs",
        model_dir.path,
        info.model_type,
        info.task,
        device,
        info.dtype,
        backend,
        info.pooling,
        time.perf_counter() - started,
    )
    return Engine(model, info, device)


def _resolve_device(requested: str) -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda was asked for but torch sees no CUDA device")
    return torch.device(requested)


def _resolve_dtype(requested: str, device: torch.device) -> torch.dtype:
    if requested == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[requested]
