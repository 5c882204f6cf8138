"""The one interface every served model family implements, and the facts the worker reads off it.

A served model maps a packed ragged batch to one float32 row per sequence: pooled vectors for
embedders, logits for cross-encoders. The engine (eager or CUDA-graph replay) calls nothing else.
"""

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from kembed.proto.outputs import COLBERT, DENSE, SPARSE, TOKENS, OutputShape
from kembed.worker.engine.layers.attention import AttentionMetadata
from kembed.worker.engine.layers.pooling import pool
from kembed.worker.engine.models.dense import Dense, DenseSpec
from kembed.worker.engine.models.heads import M3Heads, check_heads
from kembed.worker.engine.payload import zero_rows


@dataclass(frozen=True)
class ModelFacts:
    """What the rest of the worker needs to know about a built model."""

    task: str  # "embed" (pooled vectors) or "score" (cross-encoder logits)
    output_size: int  # columns of each output row: hidden size, or number of labels
    max_sequence_length: int  # tokens the position table allows
    vocab_size: int
    pooling: str = ""  # "cls" | "mean" | "last" for embedders; "" for scorers
    outputs: int = 0  # the Output kinds it has (kembed.proto.outputs); 0 for scorers
    colbert_size: int = 0  # COLBERT vectors' size, 0 without that head
    hidden_size: int = 0  # TOKENS vectors' size, 0 without that output
    sparse_vocabulary: bool = False  # SPARSE alone, one vocabulary-wide row a sequence (splade.py)

    @property
    def output_shape(self) -> OutputShape:
        return OutputShape(self.output_size, self.colbert_size, self.hidden_size)


class ServedModel(nn.Module):
    """Base of the served families. `forward` must be CUDA-graph capturable: no host syncs, no
    data-dependent shapes beyond what `AttentionMetadata` carries."""

    facts: ModelFacts

    def forward(
        self,
        input_ids: torch.Tensor,  # [num_tokens] int64
        position_ids: torch.Tensor,  # [num_tokens] int64, 0-based within each sequence
        token_type_ids: torch.Tensor,  # [num_tokens] int64
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [num_seqs, output_size] float32
        raise NotImplementedError

    def hidden_states(
        self,
        input_ids: torch.Tensor,  # [num_tokens] int64
        position_ids: torch.Tensor,  # [num_tokens] int64
        token_type_ids: torch.Tensor,  # [num_tokens] int64
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [num_tokens, hidden], the model's dtype
        """The last hidden state of every token, before pooling (span pooling, spans.py). Embedders
        implement it; a scorer has no use for it."""
        raise NotImplementedError(f"{type(self).__name__} does not give hidden states")

    def project(self, rows: torch.Tensor) -> torch.Tensor:  # [num_rows, pooled] float32
        """What the pipeline does to pooled rows before normalising (span pooling's rows too)."""
        return rows

    def forward_outputs(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        meta: AttentionMetadata,
        outputs: int | None = None,
    ) -> torch.Tensor:  # [flat words] float32, heads.FlatLayout
        """The model's outputs (`outputs`: those kinds of them; None: all) from one pass, as one flat
        block (multi-output batches)."""
        raise NotImplementedError(f"{type(self).__name__} has one output")


class PooledEmbedder(ServedModel):
    """Base of the embedder families: each gives `hidden_states`, pooled here as its
    sentence-transformers pipeline pools them (`pooling`: cls, mean or last token), then through the
    pipeline's Dense modules, if any."""

    def __init__(self, pooling: str, hidden_size: int, max_sequence_length: int, vocab_size: int) -> None:
        super().__init__()
        self.pooling = pooling
        # every embedder gives its token vectors (TOKENS) while no Dense module changes the width
        self.facts = ModelFacts(
            "embed", hidden_size, max_sequence_length, vocab_size, pooling, DENSE | TOKENS, 0, hidden_size
        )
        self.dense = nn.ModuleList()
        self.heads: M3Heads | None = None

    def load_heads(self, heads: M3Heads | None) -> None:
        """BGE-M3's sparse and ColBERT heads (heads.py), after `load_dense`; InvalidInput for one
        it cannot serve (`check_heads`: a ColBERT head not of the dense width, as the rows' layout
        needs, proto/outputs.py). Token vectors of another size than the dense width are not
        offered, for the same reason (a Dense module changed the width)."""
        facts = self.facts
        if heads is not None:
            check_heads(heads.shapes(), facts.hidden_size, facts.output_size)
        self.heads = heads
        outputs, colbert = facts.outputs, 0
        if facts.hidden_size != facts.output_size:
            outputs &= ~TOKENS
        if heads is not None and heads.sparse is not None:
            outputs |= SPARSE
        if heads is not None and heads.colbert is not None:
            outputs, colbert = outputs | COLBERT, heads.colbert_size
        hidden = facts.hidden_size if outputs & TOKENS else 0
        self.facts = dataclasses.replace(facts, outputs=outputs, colbert_size=colbert, hidden_size=hidden)

    def load_dense(self, specs: Sequence[DenseSpec]) -> None:
        """The pipeline's Dense modules, weights loaded; the rows served are the last one's size."""
        size = self.facts.output_size
        for spec in specs:
            self.dense.append(Dense.load(spec, size))
            size = spec.out_features
        self.facts = dataclasses.replace(self.facts, output_size=size)

    def project(self, rows: torch.Tensor) -> torch.Tensor:
        for dense in self.dense:
            rows = dense(rows)
        return rows

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        return self._pooled(self.hidden_states(input_ids, position_ids, token_type_ids, meta), meta)

    def _pooled(self, hidden: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        return self.project(pool(hidden, meta, self.pooling).float())  # [num_seqs, output_size] float32

    def forward_outputs(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        meta: AttentionMetadata,
        outputs: int | None = None,
    ) -> torch.Tensor:
        hidden = self.hidden_states(input_ids, position_ids, token_type_ids, meta)
        outputs = self.facts.outputs if outputs is None else outputs & self.facts.outputs
        parts = [self._pooled(hidden, meta).flatten()]
        if outputs & COLBERT:
            assert self.heads is not None
            parts.append(self.heads.colbert_vectors(hidden).flatten())
        if outputs & TOKENS:
            parts.append(hidden.float().flatten())
        # zero rows: the source of the answer's sparse and padding rows (payload.py)
        width = self.facts.output_size
        parts.append(hidden.new_zeros(zero_rows(hidden.shape[0], width) * width, dtype=torch.float32))
        if outputs & SPARSE:
            assert self.heads is not None
            parts.append(self.heads.sparse_weights(hidden))
        return torch.cat(parts)
