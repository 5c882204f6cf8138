"""Pooling of packed hidden states into one vector per sequence, as sentence-transformers defines it."""

import torch

from kembed.worker.engine.layers.attention import AttentionMetadata


def pool(hidden: torch.Tensor, meta: AttentionMetadata, mode: str) -> torch.Tensor:
    """[num_tokens, hidden] → [num_seqs, hidden] by `cls` (first token), `last` token or `mean`."""
    starts = meta.cu_seqlens[:-1].long()
    ends = meta.cu_seqlens[1:].long()
    # Clamps only matter for the empty padding slots of a CUDA-graph bucket (their rows are
    # discarded): they keep indices in range and divisions finite without a host-side branch.
    last_token = hidden.shape[0] - 1
    if mode == "cls":
        return hidden[starts.clamp(max=last_token)]
    if mode == "last":
        return hidden[(ends - 1).clamp(min=0)]
    if mode == "mean":
        # Summed in float32: half-precision sums over thousands of tokens lose digits.
        sums = hidden.new_zeros(meta.num_seqs, hidden.shape[1], dtype=torch.float32)
        sums.index_add_(0, meta.seq_ids, hidden.float())
        return sums / (ends - starts).clamp(min=1).unsqueeze(1).to(torch.float32)
    raise ValueError(f"unknown pooling mode {mode!r}")
