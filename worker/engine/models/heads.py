"""BGE-M3's two extra heads, and the flat block of every output a multi-output forward writes.

BGE-M3 ships, beside its encoder, `sparse_linear` (hidden -> 1: a lexical weight per token, ReLU'd)
and `colbert_linear` (hidden -> colbert: a multi-vector per token but the first, normalised), as
FlagEmbedding's BGEM3FlagModel computes them. They load from `<name>.safetensors` when the
directory has it, else from the published `<name>.pt` through `torch.load(weights_only=True)`
(tensors only: no pickled code runs). A directory with neither has no such output. A head the worker
cannot serve refuses the model at start, naming it (`check_heads`): a sparse head must give one
weight a token, a ColBERT head vectors of the dense width (every output travels in rows of that
width, proto/outputs.py); before, such a ColBERT head was dropped without a word.

A multi-output forward (served.py) returns one flat float32 block per bucket, laid out as
`FlatLayout` says: what a captured graph writes, and what `assemble` (payload.py) gathers each
sequence's answer from.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from kembed.proto.outputs import COLBERT, DENSE, SPARSE, TOKENS
from kembed.worker.engine.payload import zero_rows
from kembed.worker.errors import InvalidInput

HEAD_FILES = ("sparse_linear", "colbert_linear")


def _read_head(path: Path, name: str) -> dict[str, torch.Tensor] | None:
    """A head's state dict (`weight`, `bias`) from the directory, or None if it has none."""
    safe = path / f"{name}.safetensors"
    if safe.is_file():
        return load_file(safe)
    pickled = path / f"{name}.pt"
    if pickled.is_file():
        try:
            state = torch.load(pickled, map_location="cpu", weights_only=True)
        except Exception as exc:  # weights_only refuses anything but tensors and plain containers
            raise InvalidInput(f"{pickled} is not a plain tensor state dict: {exc}") from None
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise InvalidInput(f"{pickled} is not a state dict of tensors")
        return state
    return None


def head_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Each head's weight shape as the directory holds it (a safetensors header is read, not its
    tensors); heads it lacks are absent."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for name in HEAD_FILES:
        safe = Path(path) / f"{name}.safetensors"
        if safe.is_file():
            with safe_open(str(safe), framework="pt") as tensors:
                has = "weight" in tensors.keys()  # noqa: SIM118 (a safe_open handle, not a dict)
                shapes[name] = tuple(tensors.get_slice("weight").get_shape()) if has else ()
            continue
        state = _read_head(Path(path), name)
        if state is not None:
            weight = state.get("weight")
            shapes[name] = () if weight is None else tuple(weight.shape)
    return shapes


def check_heads(shapes: Mapping[str, tuple[int, ...]], hidden: int, width: int) -> None:
    """InvalidInput naming a head the worker cannot serve: `sparse_linear` must be [1, hidden]
    (a weight a token), `colbert_linear` [width, hidden], its vectors of the dense rows' `width`."""
    for name, shape in shapes.items():
        if len(shape) != 2 or shape[1] != hidden:
            raise InvalidInput(f"{name}: a weight [out, {hidden}] is expected, got {list(shape)}")
    sparse = shapes.get("sparse_linear")
    if sparse is not None and sparse[0] != 1:
        raise InvalidInput(
            f"sparse_linear gives {sparse[0]} weights a token; a sparse head gives one ([1, {hidden}])"
        )
    colbert = shapes.get("colbert_linear")
    if colbert is not None and colbert[0] != width:
        raise InvalidInput(
            f"colbert_linear gives vectors of {colbert[0]} values, the model's dense vectors have {width}: "
            "kembed serves ColBERT vectors of the dense width only (each output travels in rows of "
            "that width); remove colbert_linear.* from the directory to serve the model without them"
        )


def _linear(state: dict[str, torch.Tensor], name: str, hidden: int) -> nn.Linear:
    weight = state.get("weight")
    if weight is None or weight.ndim != 2 or weight.shape[1] != hidden:
        raise InvalidInput(
            f"{name}: a weight [out, {hidden}] is expected, got {getattr(weight, 'shape', None)}"
        )
    linear = nn.Linear(hidden, weight.shape[0], bias="bias" in state)
    linear.load_state_dict(state, strict=True)
    return linear


class M3Heads(nn.Module):
    """The heads a directory has (either may be None)."""

    def __init__(self, sparse: nn.Linear | None, colbert: nn.Linear | None) -> None:
        super().__init__()
        self.sparse = sparse
        self.colbert = colbert

    @classmethod
    def load(cls, path: Path, hidden: int) -> "M3Heads | None":
        states = {name: _read_head(Path(path), name) for name in HEAD_FILES}
        if not any(states.values()):
            return None
        sparse, colbert = (
            None if states[name] is None else _linear(states[name], name, hidden)  # type: ignore[arg-type]
            for name in HEAD_FILES
        )
        return cls(sparse, colbert)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Each loaded head's weight shape, as `check_heads` takes them."""
        heads = {"sparse_linear": self.sparse, "colbert_linear": self.colbert}
        return {name: tuple(head.weight.shape) for name, head in heads.items() if head is not None}

    @property
    def colbert_size(self) -> int:
        return 0 if self.colbert is None else self.colbert.out_features

    def sparse_weights(self, hidden: torch.Tensor) -> torch.Tensor:  # [num_tokens] float32
        assert self.sparse is not None
        return torch.relu(self.sparse(hidden).float()).squeeze(-1)

    def colbert_vectors(self, hidden: torch.Tensor) -> torch.Tensor:  # [num_tokens, colbert] float32
        assert self.colbert is not None
        return F.normalize(self.colbert(hidden).float(), dim=-1)


@dataclass(frozen=True)
class FlatLayout:
    """Where each output of a bucket of `num_seqs` slots and `num_tokens` tokens sits in the flat
    block, in words: dense [num_seqs, dense], colbert [num_tokens, colbert], tokens [num_tokens,
    hidden], zero rows [payload.zero_rows, dense], sparse [num_tokens]; the kinds the model lacks
    take no room. The vectors come first and have the dense width, so the block's head is one row
    matrix."""

    outputs: int
    num_seqs: int
    num_tokens: int
    dense: int
    colbert: int
    hidden: int

    def offsets(self) -> dict[int, int]:
        at, offsets = 0, {}
        for kind, size in (
            (DENSE, self.num_seqs * self.dense),
            (COLBERT, self.num_tokens * self.colbert),
            (TOKENS, self.num_tokens * self.hidden),
            (0, zero_rows(self.num_tokens, self.dense) * self.dense),
            (SPARSE, self.num_tokens),
        ):
            if self.outputs & kind or not kind:
                offsets[kind] = at
                at += size
        return offsets
