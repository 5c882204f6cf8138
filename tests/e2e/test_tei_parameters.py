"""TEI's `parameters` object of `/similarity` (and of the root route's similarity body, where
huggingface_hub's `sentence_similarity` posts) acts, through a real gateway and real workers: its
`truncate`, `truncation_direction` and `prompt_name` each change the answer as they do on `/embed`.
Before, the object was ignored: `parameters.truncate: false` answered 200 on a 400-word input."""

import httpx
import numpy as np
import pytest
from processes import PROMPTS

LONG = (
    "Simmer the onions slowly in butter, add garlic, thyme and a splash of white wine. " * 12
    + "Neutron stars are the collapsed cores of massive stars, spinning hundreds of times a second. " * 12
)  # ~400 tokens, past the bundled model's 256
SHORT = ["Onions simmered in butter with thyme.", "A neutron star spins very fast."]


def similarity(url: str, route: str, **parameters) -> httpx.Response:
    body = {"inputs": {"source_sentence": LONG, "sentences": SHORT}, "parameters": parameters}
    return httpx.post(f"{url}{route}", json=body, timeout=60)


def cosines(vectors: np.ndarray) -> list[float]:
    vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors[1:] @ vectors[0]).tolist()


@pytest.mark.parametrize("route", ["/similarity", "/"])
def test_parameters_truncate_false_refuses_a_long_input(stack, route):
    refused = similarity(stack.url, route, truncate=False)
    assert refused.status_code == 413, refused.text
    assert "input 0 has" in refused.json()["error"]
    assert similarity(stack.url, route, truncate=True).status_code == 200


@pytest.mark.parametrize("route", ["/similarity", "/"])
def test_parameters_truncation_direction_keeps_that_end(stack, reference, route):
    left = similarity(stack.url, route, truncation_direction="Left")  # TEI's spelling
    right = similarity(stack.url, route)
    assert left.status_code == right.status_code == 200, left.text
    reference.tokenizer.truncation_side = "left"
    try:
        expected_left = cosines(reference.encode([LONG, *SHORT]))
    finally:
        reference.tokenizer.truncation_side = "right"
    np.testing.assert_allclose(left.json(), expected_left, atol=2e-3)
    np.testing.assert_allclose(right.json(), cosines(reference.encode([LONG, *SHORT])), atol=2e-3)
    assert abs(left.json()[1] - right.json()[1]) > 0.05  # the kept end decides the second


@pytest.mark.parametrize("route", ["/similarity", "/"])
def test_parameters_prompt_name_applies_the_prompt(prompt_gateway, prompt_model_dir, route):
    from sentence_transformers import SentenceTransformer

    prompted = SentenceTransformer(str(prompt_model_dir), device="cpu")
    texts = ["Where does the cat sit?", "The cat sits on the mat.", "Stars spin."]
    body = {"inputs": {"source_sentence": texts[0], "sentences": texts[1:]}}
    with_prompt = httpx.post(
        f"{prompt_gateway.url}{route}", json=body | {"parameters": {"prompt_name": "query"}}, timeout=60
    )
    without = httpx.post(f"{prompt_gateway.url}{route}", json=body | {"parameters": {}}, timeout=60)
    assert with_prompt.status_code == without.status_code == 200, with_prompt.text
    expected = cosines(prompted.encode(texts, prompt_name="query"))
    np.testing.assert_allclose(with_prompt.json(), expected, atol=2e-3)
    np.testing.assert_allclose(without.json(), cosines(prompted.encode(texts)), atol=2e-3)
    assert PROMPTS["query"] and not np.allclose(with_prompt.json(), without.json(), atol=2e-3)


def test_an_option_given_in_both_places_is_refused(stack):
    body = {"inputs": {"source_sentence": "a", "sentences": ["b"]}, "truncate": True}
    url = f"{stack.url}/similarity"
    assert httpx.post(url, json=body, timeout=30).status_code == 200  # kembed's place, beside inputs
    twice = httpx.post(url, json=body | {"parameters": {"truncate": True}}, timeout=30)
    assert twice.status_code == 422 and "truncate is given twice" in twice.json()["error"]


def test_huggingface_hubs_sentence_similarity_sends_parameters_and_is_answered(stack):
    """`InferenceClient.sentence_similarity` sends `"parameters": {}`: taken (before, as after)."""
    from huggingface_hub import InferenceClient

    got = InferenceClient(base_url=stack.url).sentence_similarity(SHORT[0], other_sentences=SHORT[1:])
    assert len(got) == 1 and -1 <= got[0] <= 1
