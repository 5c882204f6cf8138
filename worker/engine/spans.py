"""Span pooling ("late chunking"): a sequence run whole, one pooled row per span of its tokens.

A span batch holds sequences of two kinds: those without spans, pooled the model's own way (one row,
as in any batch), and those with k spans given by k + 1 boundaries, pooled once per span (k rows):
the mean of the last hidden states of the span's tokens, whatever the model's pooling. A mean is what
late chunking takes for every model: a CLS or last token sums up the whole sequence, not one span of
it. Tokens outside every span (special tokens, a prompt) are attended to but pooled into no row.
Normalisation, where the model has it, is the caller's, per row, as for ordinary rows.

The index is built on the host when the batch is packed (numpy); the pooling runs on the device
after an eager forward that stops at the hidden states. Span batches never run in a CUDA graph: the
graphs pool inside the captured forward, one row per sequence.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from kembed.worker.engine.layers.attention import AttentionMetadata
from kembed.worker.engine.layers.pooling import pool
from kembed.worker.engine.models.served import ServedModel


@dataclass(frozen=True)
class SpanIndex:
    """Where each token of a span batch is pooled, and which pooled rows the batch answers, in order."""

    num_seqs: int  # real sequences of the batch
    token_rows: np.ndarray  # [num_tokens] int64: the span row of each real token; num_span_rows: none
    span_sizes: np.ndarray  # [num_span_rows] float32: tokens per span (>= 1)
    out_rows: np.ndarray  # [num_rows] int64 into [sequence rows (num_seqs); span rows (num_span_rows)]

    @property
    def num_rows(self) -> int:
        return len(self.out_rows)

    @classmethod
    def build(cls, lengths: np.ndarray, spans: Sequence[np.ndarray | None]) -> "SpanIndex":
        """`spans[i]`: None (sequence i pooled as usual) or its k + 1 boundaries, strictly increasing,
        within [0, lengths[i]] (checked by the server before the batch gets here)."""
        num_seqs = len(lengths)
        starts = np.zeros(num_seqs + 1, dtype=np.int64)
        np.cumsum(lengths, out=starts[1:])
        num_span_rows = sum(len(bounds) - 1 for bounds in spans if bounds is not None)
        token_rows = np.full(int(starts[-1]), num_span_rows, dtype=np.int64)
        span_sizes = np.empty(num_span_rows, dtype=np.float32)
        out_rows: list[int] = []
        row = 0
        for i, bounds in enumerate(spans):
            if bounds is None:
                out_rows.append(i)
                continue
            num_spans = len(bounds) - 1
            first, last = int(bounds[0]), int(bounds[-1])
            # token t of the sequence is in span j where bounds[j] <= t < bounds[j + 1]
            positions = np.arange(first, last)
            token_rows[starts[i] + first : starts[i] + last] = (
                row + np.searchsorted(bounds, positions, side="right") - 1
            )
            span_sizes[row : row + num_spans] = np.diff(bounds)
            out_rows.extend(range(num_seqs + row, num_seqs + row + num_spans))
            row += num_spans
        return cls(num_seqs, token_rows, span_sizes, np.asarray(out_rows, dtype=np.int64))


def pool_spans(hidden: torch.Tensor, meta: AttentionMetadata, mode: str, index: SpanIndex) -> torch.Tensor:
    """[num_tokens, hidden] → [index.num_rows, hidden] float32: sequences without spans pooled by
    `mode`, spans by their mean. `hidden` may have padding tokens after the real ones (none pooled)."""
    device = hidden.device
    rows = pool(hidden, meta, mode).float()[: index.num_seqs]
    token_rows = torch.from_numpy(index.token_rows).to(device, non_blocking=True)
    real = hidden[: len(index.token_rows)].float()  # summed in float32, as mean pooling does
    sums = real.new_zeros(len(index.span_sizes) + 1, hidden.shape[1])  # the last row: tokens in no span
    sums.index_add_(0, token_rows, real)
    sizes = torch.from_numpy(index.span_sizes).to(device, non_blocking=True)
    means = sums[:-1] / sizes.unsqueeze(1)
    out_rows = torch.from_numpy(index.out_rows).to(device, non_blocking=True)
    return torch.cat([rows, means])[out_rows]


def forward_spans(
    model: ServedModel,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    token_type_ids: torch.Tensor,
    meta: AttentionMetadata,
    index: SpanIndex,
) -> torch.Tensor:
    """The model's forward up to its last hidden states, then `pool_spans`, then what the pipeline
    does to pooled rows (its Dense modules) (eager only)."""
    hidden = model.hidden_states(input_ids, position_ids, token_type_ids, meta)
    return model.project(pool_spans(hidden, meta, model.facts.pooling, index))
