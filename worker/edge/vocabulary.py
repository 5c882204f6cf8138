"""A vocabulary-indexed sparse model's answers at the worker's edges (ModelInfo.sparse_vocabulary:
SPLADE, worker/engine/models/splade.py).

Such a model answers SPARSE alone, and its engine gives one vocabulary-wide row per sequence, run
as a dense batch (the same graphs, ring and prewarm). Those rows never leave the worker: the data
port and the unary call send each row's nonzero weights as kembed.proto.outputs lays them out
(`vocabulary_words`), in rows of width 1, so a request's row count is its sequences' words.
"""

import numpy as np

from kembed.proto.outputs import SPARSE, vocabulary_words
from kembed.worker.errors import InvalidInput
from kembed.worker.info import ModelInfo


def check_asks(info: ModelInfo, outputs: np.ndarray | int) -> None:
    """InvalidInput unless every request asks for SPARSE alone (0 is dense alone: refused)."""
    if np.any(np.asarray(outputs) != SPARSE):
        raise InvalidInput(
            f'model {info.model_name} has no dense output (it has: sparse): ask for outputs ["sparse"]'
        )


def compact(num_rows: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Requests' vocabulary-wide rows (`num_rows` [num_requests] of `rows` [sum, vocab], request
    after request) as their words: (words of each request [num_requests] int64, words [total, 1])."""
    sizes, words = vocabulary_words(rows)
    firsts = np.cumsum(num_rows) - num_rows
    per_request = np.add.reduceat(sizes, firsts) if len(sizes) else np.zeros(len(num_rows), np.int64)
    return per_request, words.reshape(-1, 1)
