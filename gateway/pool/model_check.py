"""Whether a worker replica serves the model this gateway tokenizes for.

The gateway turns texts into ids with its own model directory's tokenizer; a worker that loaded
another model embeds those ids all the same and answers wrong vectors with no error anywhere (a cased
tokenizer's ids into an uncased model, a permuted vocabulary, a longer max_seq_length). So each
replica's Info is checked when it is read, before any chunk goes to it:

- its **tokenizer digest** must be this gateway's own (kembed.proto.model_identity: tokenizer.json
  and the directory's tokenization settings);
- its **model digest** (weights and the configs that shape the answer) must be this gateway's own
  where the gateway's directory holds the weights; where it does not (a gateway pod on Kubernetes
  fetches all but the weights), it must be that of the replicas accepted and serving now, as must
  what the replica says of its answers (task, dimensions, pooling, normalisation, outputs): one text
  never gets two different vectors from one gateway.

A refused replica gets no work; it is probed as any other and accepted once it serves the right
model (a worker restarted on another directory). A replica that reports no digest (an older kembed,
a directory without tokenizer.json) cannot be checked: it is accepted, and the gateway says so.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from pathlib import Path

from kembed.proto import embedder_pb2 as pb
from kembed.proto.model_files import load_model_spec
from kembed.proto.model_identity import ModelIdentity, read_identity

log = logging.getLogger(__name__)


def read_own_identity(model_dir: Path) -> ModelIdentity:
    """The gateway's model: `model_dir`'s digests, read once at start (several gateway processes
    share one reading: processes.py). Its weights are hashed if it holds them (~1 GB/s a core)."""
    started = time.perf_counter()
    identity = read_identity(model_dir, load_model_spec(model_dir))
    log.info(
        "gateway model %s: %s%s (%.1f s)",
        model_dir,
        identity.short(),
        "" if identity.model else "; no weight files here, so replicas are held to those serving",
        time.perf_counter() - started,
    )
    return identity


def _short(digest: str) -> str:
    return digest.removeprefix("sha256:")[:12]


def _answers(info: pb.InfoResponse) -> tuple[object, ...]:
    """What a replica says of its answers, beyond the digests: equal for replicas that answer alike."""
    return (
        info.task, info.dimensions, info.pooling, info.normalize, info.outputs, info.colbert_dimensions,
        tuple(info.tasks), info.default_task,  # a request naming no task gets the default's vectors
    )  # fmt: skip


def _described(info: pb.InfoResponse) -> str:
    return (
        f"task {info.task}, {info.dimensions} dimensions, pooling {info.pooling or 'none'}, "
        f"normalize {str(info.normalize).lower()}, outputs {info.outputs}"
        + (f", default task {info.default_task or 'none'}" if info.tasks else "")
    )


class ModelCheck:
    """The gateway's model (`own`, read from `model_dir` at start) against each replica's Info."""

    def __init__(self, own: ModelIdentity, model_dir: Path) -> None:
        self.own = own
        self._model_dir = model_dir

    def refusal(self, info: pb.InfoResponse, serving: Iterable[pb.InfoResponse]) -> str:
        """Why a replica answering `info` must get no work ("" if it may), given the Info of the
        replicas accepted and serving now (`serving`, the replica itself not among them)."""
        own = self.own
        if info.tokenizer_digest and own.tokenizer and info.tokenizer_digest != own.tokenizer:
            return (
                f"serves another model: its tokenizer {_short(info.tokenizer_digest)} is not the one this "
                f"gateway tokenizes with ({_short(own.tokenizer)}: tokenizer.json and the tokenization "
                f"settings of {self._model_dir}): it would embed this gateway's ids as ids of its own model"
            )
        if info.model_digest and own.model and info.model_digest != own.model:
            return (
                f"serves another model: its weights and configs {_short(info.model_digest)} are not those "
                f"of this gateway's model directory {self._model_dir} ({_short(own.model)})"
            )
        reference = next(iter(serving), None)
        if reference is None:
            return ""
        if not own.model and info.model_digest and reference.model_digest not in ("", info.model_digest):
            return (
                f"serves other weights than the replicas serving: model {_short(info.model_digest)}, "
                f"theirs {_short(reference.model_digest)}"
            )
        if _answers(info) != _answers(reference):
            return f"answers unlike the replicas serving: {_described(info)}, theirs {_described(reference)}"
        return ""

    def is_unchecked(self, info: pb.InfoResponse) -> bool:
        """Whether `info` lacks a digest the gateway could check it by (a warning, not a refusal)."""
        return not info.tokenizer_digest or (bool(self.own.model) and not info.model_digest)
