"""Matryoshka truncation, normalisation and base64 encoding of pooled vectors."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from kembed.gateway.errors import WorkerFailed
from kembed.gateway.vectors import decode_embeddings, finish, to_base64
from kembed.proto import embedder_pb2 as pb

RAW = np.array([[3.0, 4.0, 12.0], [0.0, 0.0, 0.0]], dtype=np.float32)


@pytest.mark.parametrize(
    ("dimensions", "normalize", "expected"),
    [
        (None, False, RAW),
        (None, True, [[3 / 13, 4 / 13, 12 / 13], [0, 0, 0]]),
        (2, True, [[0.6, 0.8], [0, 0]]),
        (2, False, [[3.0, 4.0], [0, 0]]),
        (3, True, [[3 / 13, 4 / 13, 12 / 13], [0, 0, 0]]),
    ],
    ids=["raw", "normalised", "truncated-then-renormalised", "truncated-raw", "full-dimensions"],
)
def test_finish_truncates_before_normalising(dimensions, normalize, expected):
    result = finish(RAW, dimensions=dimensions, normalize=normalize)
    assert result.dtype == np.float32 and result.flags.c_contiguous
    np.testing.assert_allclose(result, expected, rtol=1e-6)


def test_base64_is_float32_little_endian_as_the_openai_sdk_decodes_it():
    row = np.array([0.25, -1.5, 3.0], dtype=np.float32)
    assert np.frombuffer(base64.b64decode(to_base64(row)), dtype="float32").tolist() == [0.25, -1.5, 3.0]


def test_decode_rejects_a_response_of_the_wrong_size():
    response = pb.EmbedResponse(embeddings=np.zeros(5, "<f4").tobytes(), num_sequences=2, dimensions=3)
    with pytest.raises(WorkerFailed, match="5 floats, expected 2 x 3"):
        decode_embeddings(response, 2)


def test_decode_reads_row_major_matrix():
    response = pb.EmbedResponse(embeddings=RAW.astype("<f4").tobytes(), num_sequences=2, dimensions=3)
    np.testing.assert_array_equal(decode_embeddings(response, 2), RAW)
