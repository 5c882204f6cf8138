"""Worker results to client values: decoding vectors and scores, matryoshka truncation, normalisation,
sigmoid, base64, int8 and binary quantisation."""

from __future__ import annotations

import base64
import binascii
from typing import Literal

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
    # np.linalg.norm's sum of squares written out (the same float32 arithmetic): a third less per query
    norms = np.sqrt((matrix * matrix).sum(axis=1, keepdims=True))
    normalized: np.ndarray = (matrix / np.maximum(norms, 1e-12)).astype(np.float32, copy=False)
    return normalized


def to_base64(row: np.ndarray) -> str:
    """One row as base64 of its float32 little-endian bytes, what the openai SDK's
    `np.frombuffer(base64.b64decode(s), dtype="float32")` reads back."""
    return base64.b64encode(row.astype("<f4", copy=False).tobytes()).decode("ascii")


# `encoding_format` of POST /v1/embeddings: OpenAI's two, and Perplexity's two quantised ones.
EncodingFormat = Literal["float", "base64", "base64_int8", "base64_binary"]


def quantize_int8(rows: np.ndarray) -> np.ndarray:
    """Rows [n, d] as signed int8 [n, d]: each row scaled so that its largest magnitude is 127, then
    rounded to nearest (-127..127).

    sentence-transformers' `quantize_embeddings(..., "int8")` takes per-dimension ranges from a
    calibration set; a server has none per request, and ranges taken from the request itself would
    give the same text different codes in different requests. A per-row scale needs no state, uses
    the full int8 range whatever the model's norm, and leaves cosine ranking nearly intact (the
    scale divides out of a cosine): on the e2e corpus with all-MiniLM-L6-v2, top-10 neighbours by
    cosine of these int8 rows agree with float32's in 93 % of positions, 99.5 % as sets (a fixed
    scale of 127 for unit vectors: 69 %; README, "Encoding formats", has the other rules measured).
    """
    rows = np.asarray(rows, dtype=np.float32)
    max_abs = np.abs(rows).max(axis=1, keepdims=True)
    scale = np.divide(np.float32(127.0), max_abs, out=np.zeros_like(max_abs), where=max_abs > 0)
    quantized: np.ndarray = np.rint(rows * scale).astype(np.int8)  # zero rows stay zero
    return quantized


def pack_bits(rows: np.ndarray, *, bitorder: Literal["little", "big"] = "little") -> np.ndarray:
    """Rows [n, d] as packed bits, uint8 [n, ceil(d / 8)]: a bit is 1 where the component is > 0.

    `little` (Perplexity's `base64_binary`): component 0 is the lowest bit of byte 0.
    `big` is sentence-transformers' `ubinary` order (component 0 the highest bit). Unused bits of a
    last partial byte are 0, so they never add to a Hamming distance."""
    packed: np.ndarray = np.packbits(np.asarray(rows) > 0, axis=1, bitorder=bitorder)
    return packed


def encode(matrix: np.ndarray, encoding_format: EncodingFormat | None) -> list[np.ndarray] | list[str]:
    """The rows of `matrix` [n, d] as `embedding` values: float32 rows for `float` (orjson writes them
    as numbers), else base64 strings of float32 little-endian (`base64`), int8 (`base64_int8`) or
    LSB-first packed bits (`base64_binary`). Quantisation runs over the whole matrix at once."""
    if encoding_format is None or encoding_format == "float":
        return list(matrix)
    if encoding_format == "base64":
        packed = matrix.astype("<f4", copy=False)
    elif encoding_format == "base64_int8":
        packed = quantize_int8(matrix)
    else:
        packed = pack_bits(matrix)
    packed = np.ascontiguousarray(packed)
    return [binascii.b2a_base64(row.data, newline=False).decode("ascii") for row in packed]
