"""POST /v1/contextualizedembeddings (Perplexity's late chunking) through real gateway and workers:
each chunk's vector equals sentence-transformers' token embeddings of the whole document (the same
ids, run once) mean-pooled over the chunk's span and normalised; limits and bad inputs in OpenAI's
error shape."""

import base64
import itertools

import numpy as np
import pytest
import torch

DOCUMENTS = [
    [
        "The Eiffel Tower was finished in 1889 for the World's Fair.",
        "It was the tallest structure in the world for four decades.",
        "Its designer's company also built the frame of the Statue of Liberty.",
    ],
    ["Photosynthesis turns light into chemical energy.", "It happens in the chloroplasts of plant cells."],
]


def late_chunking_reference(reference, chunks: list[str]) -> np.ndarray:
    """The document as [CLS] chunk ids ... [SEP], run once, each chunk's token embeddings averaged."""
    tokenizer = reference.tokenizer
    pieces = [tokenizer(chunk, add_special_tokens=False)["input_ids"] for chunk in chunks]
    ids = [tokenizer.cls_token_id, *itertools.chain(*pieces), tokenizer.sep_token_id]
    bounds = np.cumsum([1, *map(len, pieces)])
    with torch.no_grad():
        hidden = reference[0].auto_model(input_ids=torch.tensor([ids])).last_hidden_state[0].numpy()
    rows = np.stack([hidden[a:b].mean(0) for a, b in itertools.pairwise(bounds)])
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_chunks_are_embedded_in_their_documents_context(client, reference):
    response = client.post(
        "/v1/contextualizedembeddings", json={"input": DOCUMENTS, "encoding_format": "float"}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "list"
    assert [d["index"] for d in body["data"]] == [0, 1]
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0
    for document, chunks in zip(body["data"], DOCUMENTS, strict=True):
        assert [c["index"] for c in document["data"]] == list(range(len(chunks)))
        assert {c["object"] for c in document["data"]} == {"embedding"}
        got = np.array([c["embedding"] for c in document["data"]], dtype=np.float32)
        cosines = (got * late_chunking_reference(reference, chunks)).sum(1)
        assert cosines.min() >= 0.999, cosines
        alone = reference.encode(chunks)  # each chunk embedded on its own
        assert (got * alone).sum(1).max() < 0.99


def test_default_encoding_is_base64_int8_and_dimensions_apply(client):
    response = client.post("/v1/contextualizedembeddings", json={"input": DOCUMENTS[:1], "dimensions": 128})
    assert response.status_code == 200, response.text
    embedding = response.json()["data"][0]["data"][0]["embedding"]
    codes = np.frombuffer(base64.b64decode(embedding), dtype=np.int8)
    assert codes.shape == (128,)
    assert np.abs(codes).max() == 127


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"input": []}, 400, "empty"),
        ({"input": [[]]}, 400, "input[0] is an empty document"),
        ({"input": [["a", ""]]}, 400, "input[0][1] is an empty string"),
        ({"input": [["a", "   "]]}, 400, "input[0][1] has no tokens"),
        ({"input": ["a"]}, 400, "input"),
        ({"input": [["a"]], "encoding_format": "int8"}, 400, "encoding_format"),
        ({"input": [["a"]], "dimensions": 385}, 400, "384"),
        ({"input": [["a"]], "model": "nope"}, 404, "nope"),
        ({"input": [["a"]] * 513}, 413, "512"),
        ({"input": [["a"], ["word " * 100] * 3]}, 413, "input[1] has more tokens"),
    ],
    ids=[
        "no-documents", "empty-document", "empty-chunk", "whitespace-chunk", "not-nested",
        "unknown-format", "dimensions", "unknown-model", "documents", "tokens",
    ],
)  # fmt: skip
def test_bad_requests_get_openai_errors(client, body, status, message):
    response = client.post("/v1/contextualizedembeddings", json=body)
    assert response.status_code == status, response.text
    assert message in response.json()["error"]["message"]
