"""Acceptance 1: the official openai client, against a real gateway and real worker processes."""

import base64

import numpy as np
import openai
import pytest
from processes import MODEL_NAME

TEXTS = ["The cat sits on the mat.", "Embeddings map text to vectors.", "東京は日本の首都です。", "🙂"]


@pytest.fixture
def openai_client(stack):
    with openai.OpenAI(base_url=f"{stack.url}/v1", api_key="unused", max_retries=0) as client:
        yield client


@pytest.mark.parametrize("encoding_format", [None, "float", "base64"], ids=["sdk-default", "float", "base64"])
def test_openai_client_gets_sentence_transformers_vectors(openai_client, reference, encoding_format):
    kwargs = {} if encoding_format is None else {"encoding_format": encoding_format}
    response = openai_client.embeddings.create(model=MODEL_NAME, input=TEXTS, **kwargs)
    assert [d.index for d in response.data] == list(range(len(TEXTS)))
    if encoding_format == "base64":  # asked for explicitly, the SDK hands the base64 text back as is
        got = np.stack([np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in response.data])
    else:  # the SDK's default asks for base64 and decodes it to floats itself
        got = np.array([d.embedding for d in response.data], dtype=np.float32)
    expected = reference.encode(TEXTS)
    assert got.shape == expected.shape == (len(TEXTS), 384)
    assert (got * expected).sum(1).min() >= 0.999  # both unit vectors: the dot product is the cosine
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-4)
    assert response.model == MODEL_NAME
    assert response.usage.prompt_tokens == response.usage.total_tokens > len(TEXTS) * 2


def test_openai_client_single_string_and_dimensions(openai_client, reference):
    response = openai_client.embeddings.create(model=MODEL_NAME, input="just one", dimensions=64)
    got = np.array(response.data[0].embedding, dtype=np.float32)
    expected = reference.encode(["just one"], truncate_dim=64)[0]
    assert got.shape == (64,)
    assert np.dot(got, expected) / np.linalg.norm(expected) >= 0.999
    assert abs(np.linalg.norm(got) - 1) < 1e-4  # renormalised after truncation, as OpenAI does


def test_openai_client_sees_a_clear_error_for_an_unknown_model(openai_client):
    with pytest.raises(openai.NotFoundError) as caught:
        openai_client.embeddings.create(model="text-embedding-3-small", input="x")
    assert "text-embedding-3-small" in str(caught.value)


def test_openai_client_lists_the_served_model(openai_client):
    assert [m.id for m in openai_client.models.list()] == [MODEL_NAME]


def test_a_base_url_without_v1_gets_a_message_the_sdk_shows(stack):
    """The openai SDK shows an error body's `error.message`; the 404 of an unknown route was TEI's
    shape (`error` a string), so the SDK said only "Error code: 404". Now a path that is an OpenAI
    route less its `/v1` is answered in OpenAI's shape, saying where the route is."""
    with openai.OpenAI(base_url=stack.url, api_key="unused", max_retries=0) as client:
        with pytest.raises(openai.NotFoundError) as caught:
            client.embeddings.create(model=MODEL_NAME, input="x")
        assert "POST /v1/embeddings" in str(caught.value) and "base_url ends in /v1" in str(caught.value)
        with pytest.raises(openai.NotFoundError) as listed:
            client.models.list()
        assert "GET /v1/models" in str(listed.value)
