"""A NomicBERT model (nomic-embed-text's family: rotary positions, SwiGLU, its search prompts)
through a real gateway and worker: `/v1/embeddings` with each prompt name and with Matryoshka
`dimensions`, against `SentenceTransformer(dir).encode` on the same directory."""

import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
import transformers
from processes import start_stack

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "worker"))
from encoder_dirs import VOCAB_SIZE, cosine_rows, randomise_norms, save_sentence_transformer, texts

PROMPTS = {"search_query": "search_query: ", "search_document": "search_document: "}
TEXTS = texts(11)


@pytest.fixture(scope="module")
def nomic_dir(tmp_path_factory) -> Path:
    config = transformers.NomicBertConfig(
        vocab_size=VOCAB_SIZE, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=96, initializer_range=0.2, max_position_embeddings=256,
        rope_parameters={"rope_type": "default", "rope_theta": 100.0},
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.NomicBertModel(config).eval()
    randomise_norms(model)
    return save_sentence_transformer(
        tmp_path_factory.mktemp("nomic") / "tiny-nomic", model, "bert", "mean", prompts=PROMPTS
    )


@pytest.fixture(scope="module")
def nomic_stack(log_dir, nomic_dir):
    started = start_stack(log_dir, num_workers=1, model_dir=nomic_dir, worker_model_dir=nomic_dir)
    yield started
    for proc in started.processes:
        proc.stop()


@pytest.fixture(scope="module")
def reference(nomic_dir):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(nomic_dir), device="cpu")


def embed(url: str, **body) -> np.ndarray:
    response = httpx.post(f"{url}/v1/embeddings", json={"input": TEXTS, **body}, timeout=60)
    assert response.status_code == 200, response.text
    return np.array([item["embedding"] for item in response.json()["data"]], np.float32)


@pytest.mark.parametrize("prompt_name", [None, *PROMPTS])
def test_each_prompt_gives_sentence_transformers_vectors(nomic_stack, reference, prompt_name):
    rows = embed(nomic_stack.url, prompt_name=prompt_name)
    assert cosine_rows(rows, reference.encode(TEXTS, prompt_name=prompt_name)).min() >= 0.999


def test_matryoshka_dimensions_are_the_leading_ones_renormalised(nomic_stack, reference):
    rows = embed(nomic_stack.url, prompt_name="search_query", dimensions=32)
    want = reference.encode(TEXTS, prompt_name="search_query", truncate_dim=32)
    assert rows.shape == (len(TEXTS), 32)
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-5)
    assert cosine_rows(rows, want).min() >= 0.999
