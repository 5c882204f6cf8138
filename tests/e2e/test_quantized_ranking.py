"""Quantised answers keep the ranking: on the corpus, each text's top-10 neighbours from the gateway's
`base64_int8` (by cosine) and `base64_binary` (by Hamming distance) against float32's by cosine.

Measured with the bundled all-MiniLM-L6-v2 (README, "Encoding formats"): int8 agrees in 93 % of
positions (99.5 % as sets); binary in 11.7 % of positions and 58.5 % as sets. Binary keeps only
signs, and its distances are small integers (at most 384) that often tie, so exact positions rarely
match; its floors sit just below what was measured, to catch a regression (bit order, sign, dimension).
"""

import base64

import httpx
import numpy as np
import pytest
from corpus import texts

CORPUS = texts(240)
K = 10


def embeddings(client, encoding_format: str, **options) -> list:
    response = client.post(
        "/v1/embeddings", json={"input": CORPUS, "encoding_format": encoding_format, **options}
    )
    assert response.status_code == 200, response.text
    return [d["embedding"] for d in response.json()["data"]]


def decoded(client, encoding_format: str, dtype: type, **options) -> np.ndarray:
    return np.stack(
        [
            np.frombuffer(base64.b64decode(e), dtype=dtype)
            for e in embeddings(client, encoding_format, **options)
        ]
    )


def top_k(similarity: np.ndarray) -> np.ndarray:
    """Each row's K most similar other rows, best first; ties in input order (exact duplicates in
    the corpus, such as its whitespace-only texts, have equal scores in every format)."""
    similarity = similarity.astype(np.float64)
    np.fill_diagonal(similarity, -np.inf)
    return np.argsort(-similarity, axis=1, kind="stable")[:, :K]


def cosines(rows: np.ndarray) -> np.ndarray:
    rows = rows.astype(np.float64)
    rows /= np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
    return rows @ rows.T


def agreement(got: np.ndarray, expected: np.ndarray) -> tuple[float, float]:
    """(share of positions holding the same neighbour, share of neighbours found in any position)"""
    positions = float((got == expected).mean())
    as_sets = float(np.mean([len(set(g) & set(e)) for g, e in zip(got, expected, strict=True)]) / K)
    return positions, as_sets


@pytest.fixture(scope="module")
def float_neighbours(stack) -> np.ndarray:
    with httpx.Client(base_url=stack.url, timeout=60) as client:
        return top_k(cosines(np.array(embeddings(client, "float"), dtype=np.float32)))


def test_int8_neighbours_by_cosine_agree_with_float32(client, float_neighbours):
    rows = decoded(client, "base64_int8", np.int8)
    assert rows.shape == (len(CORPUS), 384)
    positions, as_sets = agreement(top_k(cosines(rows)), float_neighbours)
    print(f"int8 top-{K} agreement: {positions:.4f} of positions, {as_sets:.4f} as sets")
    assert positions >= 0.90 and as_sets >= 0.98


def test_binary_neighbours_by_hamming_distance_agree_with_float32(client, float_neighbours):
    packed = decoded(client, "base64_binary", np.uint8)
    assert packed.shape == (len(CORPUS), 384 // 8)
    bits = np.unpackbits(packed, axis=1, bitorder="little").astype(np.int32)
    hamming = bits @ (1 - bits).T + (1 - bits) @ bits.T
    positions, as_sets = agreement(top_k(-hamming), float_neighbours)
    print(f"binary top-{K} agreement: {positions:.4f} of positions, {as_sets:.4f} as sets")
    assert positions >= 0.10 and as_sets >= 0.56


def test_quantised_formats_follow_dimensions(client):
    floats = np.array(embeddings(client, "float", dimensions=100), dtype=np.float32)
    int8 = decoded(client, "base64_int8", np.int8, dimensions=100)
    binary = decoded(client, "base64_binary", np.uint8, dimensions=100)
    assert int8.shape == (len(CORPUS), 100) and binary.shape == (len(CORPUS), 13)
    nonzero = np.abs(floats).max(axis=1) > 0
    np.testing.assert_allclose(
        int8[nonzero], floats[nonzero] * 127 / np.abs(floats[nonzero]).max(axis=1, keepdims=True), atol=0.51
    )
    assert (np.unpackbits(binary, axis=1, bitorder="little")[:, :100] == (floats > 0)).all()
