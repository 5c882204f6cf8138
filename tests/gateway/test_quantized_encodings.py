"""Perplexity's `encoding_format`s on POST /v1/embeddings: `base64_int8` (a per-row scale to 127) and
`base64_binary` (one bit per dimension, x > 0, least significant bit first)."""

from __future__ import annotations

import base64

import numpy as np
import openai
import pytest
from gateway_fakes import FakeEmbedder, fake_vector

from kembed.gateway.vectors import encode, pack_bits, quantize_int8

HELLO_IDS = [101, 7592, 2088, 102]  # "hello world"


def test_int8_scales_each_row_so_its_largest_magnitude_is_127():
    rows = np.array([[0.5, -0.25, 0.125, 0.0], [-2.0, 1.0, 0.5, 0.01]], dtype=np.float32)
    quantized = quantize_int8(rows)
    assert quantized.dtype == np.int8 and quantized.shape == (2, 4)
    assert quantized.tolist() == [[127, -64, 32, 0], [-127, 64, 32, 1]]  # rint: -63.5 -> -64, 0.635 -> 1


def test_int8_keeps_zero_rows_zero_and_stays_in_range():
    rows = np.random.default_rng(0).normal(size=(64, 384)).astype(np.float32) * 1e3
    rows[3] = 0.0
    quantized = quantize_int8(rows)
    assert quantized[3].tolist() == [0] * 384
    assert np.abs(quantized.astype(np.int16)).max(axis=1).tolist() == [127] * 3 + [0] + [127] * 60
    cosines = (quantized * rows).sum(1) / np.maximum(
        np.linalg.norm(quantized, axis=1) * np.linalg.norm(rows, axis=1), 1e-12
    )
    assert np.delete(cosines, 3).min() > 0.999


def test_bits_are_packed_least_significant_first():
    row = np.array([[1.0, -1.0, 0.0, 2.0, -0.5, 0.5, 0.5, -3.0, 0.1, -0.1, 0.3]], dtype=np.float32)
    # bits by dimension: 1 0 0 1 0 1 1 0 | 1 0 1 (+ 5 zero pad bits): byte 0 = 1 + 8 + 32 + 64
    assert pack_bits(row).tolist() == [[0b01101001, 0b00000101]]
    assert pack_bits(row, bitorder="big").tolist() == [
        [0b10010110, 0b10100000]
    ]  # sentence-transformers' ubinary
    assert pack_bits(row).dtype == np.uint8


@pytest.mark.parametrize("dimensions", [1, 7, 8, 9, 384], ids=lambda d: f"{d}-dims")
def test_binary_is_one_bit_per_dimension(dimensions):
    rows = np.random.default_rng(dimensions).normal(size=(3, dimensions)).astype(np.float32)
    packed = pack_bits(rows)
    assert packed.shape == (3, (dimensions + 7) // 8)
    unpacked = np.unpackbits(packed, axis=1, bitorder="little")
    assert (unpacked[:, :dimensions] == (rows > 0)).all() and not unpacked[:, dimensions:].any()


def test_encode_gives_base64_of_each_format():
    rows = np.array([[0.6, -0.8, 0.0]], dtype=np.float32)
    (as_float,) = encode(rows, "float")
    assert isinstance(as_float, np.ndarray) and as_float.tolist() == rows[0].tolist()
    decoded = {
        fmt: base64.b64decode(encode(rows, fmt)[0]) for fmt in ("base64", "base64_int8", "base64_binary")
    }
    assert np.frombuffer(decoded["base64"], dtype="<f4").tolist() == rows[0].tolist()
    assert np.frombuffer(decoded["base64_int8"], dtype=np.int8).tolist() == [95, -127, 0]
    assert decoded["base64_binary"] == bytes([0b001])


def normalised_vector(ids: list[int], dimensions: int | None = None) -> np.ndarray:
    vector = fake_vector(np.array(ids))[:dimensions]
    return vector / np.linalg.norm(vector)


@pytest.mark.parametrize("dimensions", [None, 5], ids=["all-dims", "5-dims"])
async def test_openai_route_answers_int8_as_base64(gateway_with, dimensions):
    options = {} if dimensions is None else {"dimensions": dimensions}
    async with gateway_with(FakeEmbedder()) as client:
        response = await client.post(
            "/v1/embeddings", json={"input": ["hello world"], "encoding_format": "base64_int8", **options}
        )
        floats = await client.post(
            "/v1/embeddings", json={"input": ["hello world"], "encoding_format": "float", **options}
        )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["usage"] == floats.json()["usage"] == {"prompt_tokens": 4, "total_tokens": 4}
    (item,) = body["data"]
    assert item["object"] == "embedding" and item["index"] == 0
    got = np.frombuffer(base64.b64decode(item["embedding"]), dtype=np.int8)
    expected = normalised_vector(HELLO_IDS, dimensions)  # truncated, renormalised, then quantised
    assert got.shape == expected.shape and np.abs(got.astype(np.int16)).max() == 127
    np.testing.assert_allclose(got, expected * 127 / np.abs(expected).max(), atol=0.5)


async def test_openai_route_answers_binary_as_base64_packed_bits(gateway_with):
    async with gateway_with(FakeEmbedder()) as client:
        response = await client.post(
            "/v1/embeddings",
            json={"input": ["hello world", [0, 5, 7]], "encoding_format": "base64_binary", "dimensions": 3},
        )
    assert response.status_code == 200, response.text
    # fake vectors: [length, first id, last id, ...]; for [0, 5, 7] the first id 0 gives a 0 bit.
    assert [base64.b64decode(d["embedding"]) for d in response.json()["data"]] == [b"\x07", b"\x05"]


async def test_openai_sdk_passes_a_quantised_format_as_its_own_argument(gateway_with):
    """The SDK's `encoding_format` is typed `float`/`base64` but not checked at run time, and a
    format given explicitly comes back as the server sent it. Through `extra_body` alone the SDK
    would also send `encoding_format`, but would then decode the answer as float32 base64."""
    async with gateway_with(FakeEmbedder()) as client:
        sdk = openai.AsyncOpenAI(base_url="http://gateway/v1", api_key="unused", http_client=client)
        result = await sdk.embeddings.create(
            model="fake-minilm",
            input=["hello world", "x"],
            encoding_format="base64_int8",  # type: ignore[arg-type]
        )
    assert [item.index for item in result.data] == [0, 1]
    got = np.frombuffer(base64.b64decode(result.data[0].embedding), dtype=np.int8)  # type: ignore[arg-type]
    expected = normalised_vector(HELLO_IDS)
    np.testing.assert_allclose(got, expected * 127 / np.abs(expected).max(), atol=0.5)
    assert result.usage.prompt_tokens == 7


async def test_an_unknown_encoding_format_is_refused_naming_the_accepted_ones(gateway_with):
    async with gateway_with(FakeEmbedder()) as client:
        response = await client.post("/v1/embeddings", json={"input": "x", "encoding_format": "base64_uint8"})
    assert 400 <= response.status_code < 500
    error = response.json()["error"]
    assert error["param"] == "encoding_format" and "base64_int8" in error["message"]
