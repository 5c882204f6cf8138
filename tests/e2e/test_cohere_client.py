"""The official cohere v2 client against a real gateway and real worker processes: /v2/embed's float
vectors are sentence-transformers' (the prompt that `input_type` picks included)."""

import cohere
import numpy as np
from processes import MODEL_NAME, PROMPTS

TEXTS = ["The cat sits on the mat.", "Embeddings map text to vectors.", "東京は日本の首都です。", "🙂"]


def test_cohere_client_gets_sentence_transformers_vectors(stack, reference):
    with cohere.ClientV2(api_key="unused", base_url=stack.url, max_retries=0) as client:
        response = client.embed(model=MODEL_NAME, texts=TEXTS, input_type="search_document")
    got = np.array(response.embeddings.float_, dtype=np.float32)
    expected = reference.encode(TEXTS)
    assert got.shape == expected.shape == (len(TEXTS), 384)
    assert (got * expected).sum(1).min() >= 0.999  # both unit vectors: the dot product is the cosine


def test_input_type_search_query_applies_the_query_prompt(prompt_gateway, reference):
    with cohere.ClientV2(api_key="unused", base_url=prompt_gateway.url, max_retries=0) as client:
        response = client.embed(model=MODEL_NAME, texts=TEXTS, input_type="search_query")
    got = np.array(response.embeddings.float_, dtype=np.float32)
    expected = reference.encode([PROMPTS["query"] + text for text in TEXTS])
    assert (got * expected).sum(1).min() >= 0.999
