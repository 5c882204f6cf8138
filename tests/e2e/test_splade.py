"""A SPLADE model (sentence-transformers' SparseEncoder directory) through a real gateway and worker:
its sparse vectors on `/v1/embeddings` with `outputs` and on TEI's `/embed_sparse` against
SparseEncoder.encode, what /info and /openapi.json say it has, and what is refused."""

import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
from processes import start_stack
from schemathesis import GenerationMode
from test_openapi import run_operations

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "worker"))
from splade_model import build_splade_dir, splade_reference

TEXTS = ["w1 w2 w3 w2", "w7", "w5 w9 w11 w13 w15 w17 w19 w21 nothere w5", "w0 w0 w0"]


@pytest.fixture(scope="module")
def splade_dir(tmp_path_factory):
    return build_splade_dir(tmp_path_factory.mktemp("splade") / "tiny-splade")


@pytest.fixture(scope="module", params=["frames", "unary"])
def splade_stack(request, log_dir, splade_dir):
    """Both of the gateway's transports: the sparse answers' row counts are known only once run."""
    started = start_stack(
        log_dir,
        num_workers=1,
        model_dir=splade_dir,
        worker_model_dir=splade_dir,
        gateway_args=("--worker-transport", request.param),
    )
    yield started
    for proc in started.processes:
        proc.stop()


def _close(ids: list[int], values: list[float], want: dict[int, float]) -> None:
    assert ids == sorted(want)
    assert np.abs(np.array(values) - [want[i] for i in ids]).max() <= 1e-3


def test_v1_embeddings_sparse_matches_sparse_encoder(splade_stack, splade_dir):
    body = {"input": TEXTS, "outputs": ["sparse"]}
    response = httpx.post(f"{splade_stack.url}/v1/embeddings", json=body, timeout=60)
    assert response.status_code == 200, response.text
    for item, want in zip(response.json()["data"], splade_reference(splade_dir, TEXTS), strict=True):
        assert "embedding" not in item
        _close(item["sparse_embedding"]["indices"], item["sparse_embedding"]["values"], want)


def test_embed_sparse_matches_sparse_encoder(splade_stack, splade_dir):
    answer = httpx.post(f"{splade_stack.url}/embed_sparse", json={"inputs": TEXTS}, timeout=60).json()
    for entries, want in zip(answer, splade_reference(splade_dir, TEXTS), strict=True):
        _close([e["index"] for e in entries], [e["value"] for e in entries], want)


def test_info_and_openapi_say_sparse_alone(splade_stack):
    assert httpx.get(f"{splade_stack.url}/info").json()["outputs"] == ["sparse"]
    document = httpx.get(f"{splade_stack.url}/openapi.json").json()
    paths = document["paths"]
    assert "/embed_sparse" in paths and "/v1/embeddings" in paths
    assert not {"/embed_all", "/embed", "/v2/embed", "/similarity"} & set(paths)  # they answer dense
    request = document["components"]["schemas"]["EmbeddingRequest"]
    assert request["properties"]["outputs"]["items"]["enum"] == ["sparse"]  # and not null:
    assert "outputs" in request["required"]  # without it the answer would be dense


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["valid", "invalid"])
def test_schemathesis_finds_the_document_as_strict_as_the_server(splade_stack, mode):
    answered = run_operations(splade_stack.url, mode, {None, "embed"})
    if mode is GenerationMode.POSITIVE:
        assert {"POST /v1/embeddings", "POST /embed_sparse"} <= set(answered)
        assert answered["POST /v1/embeddings"][1] > 0 and answered["POST /embed_sparse"][1] > 0


@pytest.mark.parametrize(
    "body",
    [
        {"input": ["w1"]},
        {"input": ["w1"], "outputs": ["dense", "sparse"]},
        {"input": ["w1"], "outputs": ["colbert"]},
    ],
    ids=["dense-path", "dense-and-sparse", "colbert"],
)
def test_anything_but_sparse_is_refused_naming_it(splade_stack, body):
    response = httpx.post(f"{splade_stack.url}/v1/embeddings", json=body, timeout=30)
    assert response.status_code == 400, response.text
    assert "it has: sparse" in response.text
