"""Acceptance 5: dimensions, normalize=false, prompt_name and left truncation act as sentence-transformers."""

import numpy as np
import pytest
from processes import PROMPTS

TEXTS = ["what is a vector database?", "kembed serves embeddings from GPUs", "Grüße aus Berlin 🐻"]
LONG = [
    "Simmer the onions slowly in butter, add garlic, thyme and a splash of white wine. " * 12
    + "Neutron stars are the collapsed cores of massive stars, spinning hundreds of times a second. " * 12
]


def embed(client, **body) -> np.ndarray:
    response = client.post("/embed", json=body)
    assert response.status_code == 200, response.text
    return np.array(response.json(), dtype=np.float32)


def cosine_rows(a, b):
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.mark.parametrize("dimensions", [32, 128, 384])
def test_dimensions_truncates_like_truncate_dim_then_renormalises(client, reference, dimensions):
    got = embed(client, inputs=TEXTS, dimensions=dimensions)
    expected = reference.encode(TEXTS, truncate_dim=dimensions)
    assert got.shape == (3, dimensions)
    assert cosine_rows(got, expected).min() >= 0.999
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-4)
    if dimensions < 384:
        full = embed(client, inputs=TEXTS)
        assert cosine_rows(got, full[:, :dimensions]).min() >= 0.999
        assert not np.allclose(got, full[:, :dimensions])  # renormalised, so not a plain slice


def test_normalize_false_gives_the_raw_pooled_vectors(client, reference):
    from sentence_transformers import SentenceTransformer

    without_normalize = SentenceTransformer(modules=[reference[0], reference[1]], device="cpu")
    got = embed(client, inputs=TEXTS, normalize=False)
    expected = without_normalize.encode(TEXTS)
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-4)
    assert np.abs(np.linalg.norm(got, axis=1) - 1).min() > 0.01  # truly not unit length


def test_prompt_name_prepends_the_models_prompt(prompt_gateway, prompt_model_dir):
    import httpx
    from sentence_transformers import SentenceTransformer

    prompted = SentenceTransformer(str(prompt_model_dir), device="cpu")
    assert prompted.prompts["query"] == PROMPTS["query"]
    with httpx.Client(base_url=prompt_gateway.url, timeout=60) as client:
        got = embed(client, inputs=TEXTS, prompt_name="query")
        plain = embed(client, inputs=TEXTS)
        via_openai = client.post(
            "/v1/embeddings", json={"input": TEXTS, "prompt_name": "passage", "encoding_format": "float"}
        ).json()
    assert cosine_rows(got, prompted.encode(TEXTS, prompt_name="query")).min() >= 0.999
    assert cosine_rows(plain, prompted.encode(TEXTS)).min() >= 0.999
    assert cosine_rows(got, plain).max() < 0.999  # the prompt really changed the vectors
    passage = np.array([d["embedding"] for d in via_openai["data"]])
    assert cosine_rows(passage, prompted.encode(TEXTS, prompt_name="passage")).min() >= 0.999


def test_left_truncation_keeps_the_end_of_the_text(client, reference):
    right = embed(client, inputs=LONG)
    left = embed(client, inputs=LONG, truncation_direction="left")
    reference.tokenizer.truncation_side = "left"
    try:
        expected_left = reference.encode(LONG)
    finally:
        reference.tokenizer.truncation_side = "right"
    assert cosine_rows(left, expected_left).min() >= 0.999
    assert cosine_rows(right, reference.encode(LONG)).min() >= 0.999
    assert cosine_rows(left, right).max() < 0.9  # the two directions keep different tokens
