"""The tokenizers built from a model directory and the ids of a list of texts: what the tokenization
threads (tokenization.py) and the bulk child processes (tokenizer_processes.py) both run, so both
give the same ids.

Truncation is state of a `tokenizers.Tokenizer` instance, so there is one instance per variant (right,
left, none) built at start and never reconfigured: concurrent requests can share them safely. The
stored padding/truncation of tokenizer.json (the bundled MiniLM ships fixed padding to 128 and
truncation at 128) is cleared first, so the ids equal sentence-transformers' `encode`.
"""

from __future__ import annotations

import numpy as np
from tokenizers import Tokenizer, normalizers

from kembed.gateway.tokenizing.encode_groups import encode_each, ids_of
from kembed.gateway.tokenizing.windows import cut_windows
from kembed.proto.model_files import Direction, ModelSpec


def load_tokenizer(spec: ModelSpec) -> Tokenizer:
    """The model's tokenizer without stored padding or truncation, lowercasing when the model says so."""
    tokenizer = Tokenizer.from_file(str(spec.tokenizer_file))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    if spec.do_lower_case:
        # As sentence-transformers does: put Lowercase in front unless one is already there.
        current = tokenizer.normalizer
        has_lowercase = isinstance(current, normalizers.Lowercase) or (
            isinstance(current, normalizers.Sequence)
            # iterable at run time; tokenizers' stub for Sequence lacks its item access
            and any(isinstance(n, normalizers.Lowercase) for n in current)  # type: ignore[attr-defined]
        )
        if not has_lowercase:
            steps = [normalizers.Lowercase()] if current is None else [normalizers.Lowercase(), current]
            tokenizer.normalizer = normalizers.Sequence(steps)
    return tokenizer


def truncating_tokenizer(base: Tokenizer, max_length: int, direction: Direction) -> Tokenizer:
    """A copy of `base` that truncates to `max_length` tokens, cutting on the `direction` side."""
    tokenizer = Tokenizer.from_str(base.to_str())
    # longest_first counts the special tokens the post-processor adds, as transformers does.
    tokenizer.enable_truncation(max_length, strategy="longest_first", direction=direction)
    return tokenizer


def encode_ids(tokenizer: Tokenizer, texts: list[str]) -> list[np.ndarray]:
    return encode_each(tokenizer, texts, ids_of)


def encode_ids_truncated(
    truncating: Tokenizer, untruncated: Tokenizer, texts: list[str], max_length: int, side: Direction
) -> list[np.ndarray]:
    """`encode_ids(truncating, texts)`, tokenizing only a window of each long text (windows.py)."""
    return encode_ids(truncating, cut_windows(untruncated, texts, max_length, side))
