"""Worker results to client values: decoding vectors and scores, matryoshka truncation, normalisation,
sigmoid, base64."""

from __future__ import annotations

import base64

import numpy as np

from kembed.gateway.errors import WorkerFailed
from kembed.proto import embedder_pb2 as pb


def decode_embeddings(response: pb.EmbedResponse, num_sequences: int) -> np.ndarray:
    """The response's float32 LE matrix, [num_sequences, dimensions]; WorkerFailed if it disagrees."""
    if response.num_sequences != num_sequences:
        raise WorkerFailed(f"worker returned {response.num_sequences} vectors for {num_sequences} sequences")
    matrix = np.frombuffer(response.embeddings, dtype="<f4")
    if matrix.size != num_sequences * response.dimensions:
        raise WorkerFailed(
            f"worker returned {matrix.size} floats, expected {num_sequences} x {response.dimensions}"
        )
    return matrix.reshape(num_sequences, response.dimensions)


def decode_scores(response: pb.ScoreResponse, num_pairs: int) -> np.ndarray:
    """The response's raw logits, [num_pairs, num_labels]; WorkerFailed if it disagrees."""
    scores = np.frombuffer(response.scores, dtype="<f4")
    if response.num_sequences != num_pairs or scores.size != num_pairs * response.num_labels:
        raise WorkerFailed(f"worker returned {scores.size} scores for {num_pairs} pairs")
    return scores.reshape(num_pairs, response.num_labels)


def relevance(logits: np.ndarray, *, raw: bool) -> np.ndarray:
    """Rerank scores [num_pairs] from one-label logits [num_pairs, 1]: the sigmoid of the logit, or
    the logit itself if `raw`. That is TEI's /rerank (sigmoid unless raw_scores) and
    sentence-transformers' `CrossEncoder.predict` default for one label (`nn.Sigmoid`); computed in
    float64 so that large logits still rank apart."""
    first = logits[:, 0].astype(np.float64)
    if np.isnan(first).any():  # as TEI: a NaN would sort anywhere and serialise as null
        raise WorkerFailed("the model returned a NaN score")
    return first if raw else 1.0 / (1.0 + np.exp(-first))


def rank(scores: np.ndarray, top_n: int | None = None) -> list[int]:
    """Indices of `scores` best first (ties keep input order), the first `top_n` if given."""
    order: list[int] = np.argsort(-scores, kind="stable")[:top_n].tolist()
    return order


def finish(matrix: np.ndarray, *, dimensions: int | None, normalize: bool) -> np.ndarray:
    """Truncate to `dimensions` (matryoshka) first, then L2-normalise each row if asked.

    Truncating before normalising is what makes a truncated vector unit length again. The epsilon
    matches torch.nn.functional.normalize (sentence-transformers' Normalize), so zero rows stay zero.
    """
    if dimensions is not None and dimensions < matrix.shape[1]:
        matrix = matrix[:, :dimensions]
    if not normalize:
        return np.ascontiguousarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    normalized: np.ndarray = (matrix / np.maximum(norms, 1e-12)).astype(np.float32, copy=False)
    return normalized


def to_base64(row: np.ndarray) -> str:
    """One row as base64 of its float32 little-endian bytes, what the openai SDK's
    `np.frombuffer(base64.b64decode(s), dtype="float32")` reads back."""
    return base64.b64encode(row.astype("<f4", copy=False).tobytes()).decode("ascii")
