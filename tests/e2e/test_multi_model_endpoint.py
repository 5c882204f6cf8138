"""One gateway, two models with different tokenizers (the bundled all-MiniLM-L6-v2 and a tiny BERT
with a word-level vocabulary), a real worker each: every request is answered by the model it names
(the `model` field, the X-Kembed-Model header, a /models/<name>/ path, else the default), as
sentence-transformers embeds it; an unknown model is its API's 404; /v1/models and /info say each
model; metrics carry the model; one model's worker killed leaves the other serving."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
import transformers
from processes import Process, free_port, spawn, wait_ready

from kembed.worker.config import bundled_model_dir

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "worker"))
from encoder_dirs import VOCAB_SIZE, cosine_rows, randomise_norms, save_sentence_transformer, texts

pytestmark = pytest.mark.slow

TEXTS = texts(5)  # words w0..w199: one token a word for the tiny model, word pieces for MiniLM
MINILM = "minilm"
TINY = "tiny-bert"  # its directory's name: no name configured


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    config = transformers.BertConfig(
        vocab_size=VOCAB_SIZE, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=96, initializer_range=0.2, max_position_embeddings=256,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    randomise_norms(model)
    return save_sentence_transformer(tmp_path_factory.mktemp("tiny") / TINY, model, "bert", "mean")


def start_worker(log_dir: Path, model_dir: Path, port: int) -> Process:
    args = ["kembed.worker", "--port", str(port), "--metrics-port", "0"]
    return spawn(
        f"worker-{model_dir.name}-{port}", [*args, "--device", "cpu", "--model", str(model_dir)], log_dir
    )


@pytest.fixture(scope="module")
def endpoint(log_dir, tiny_dir):
    ports = {MINILM: free_port(), TINY: free_port()}
    workers = {
        MINILM: start_worker(log_dir, bundled_model_dir(), ports[MINILM]),
        TINY: start_worker(log_dir, tiny_dir, ports[TINY]),
    }
    minilm = {"model_dir": str(bundled_model_dir()), "name": MINILM}  # the tiny model: its dir's name
    models = [
        minilm | {"worker_addresses": [f"127.0.0.1:{ports[MINILM]}"]},
        {"model_dir": str(tiny_dir), "worker_addresses": [f"127.0.0.1:{ports[TINY]}"]},
    ]
    port = free_port()
    gateway = spawn(
        f"gateway-{port}", ["kembed.gateway", "--port", str(port), "--models", json.dumps(models)], log_dir
    )
    url = f"http://127.0.0.1:{port}"
    processes = [*workers.values(), gateway]
    try:
        wait_ready(url, processes, timeout_s=120)
    except BaseException:
        for proc in processes:
            proc.stop()
        raise
    yield url, workers
    for proc in processes:
        proc.stop()


@pytest.fixture(scope="module")
def references(tiny_dir):
    from sentence_transformers import SentenceTransformer

    return {
        MINILM: SentenceTransformer(str(bundled_model_dir()), device="cpu").encode(TEXTS),
        TINY: SentenceTransformer(str(tiny_dir), device="cpu").encode(TEXTS),
    }


def rows_of(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    body = response.json()
    data = body["data"] if isinstance(body, dict) else body
    return np.array([item["embedding"] if isinstance(item, dict) else item for item in data], np.float32)


def matches(rows: np.ndarray, want: np.ndarray) -> bool:
    return rows.shape == want.shape and cosine_rows(rows, want).min() >= 0.999


@pytest.mark.parametrize("model", [MINILM, TINY])
def test_the_model_field_picks_the_model(endpoint, references, model):
    url, _ = endpoint
    response = httpx.post(f"{url}/v1/embeddings", json={"input": TEXTS, "model": model}, timeout=60)
    assert response.json()["model"] == model
    assert matches(rows_of(response), references[model])


def test_cohere_and_perplexity_bodies_name_their_model(endpoint, references):
    url, _ = endpoint
    cohere = httpx.post(
        f"{url}/v2/embed",
        json={"model": TINY, "texts": TEXTS, "input_type": "search_document", "embedding_types": ["float"]},
        timeout=60,
    )
    assert cohere.status_code == 200, cohere.text
    assert matches(np.array(cohere.json()["embeddings"]["float"], np.float32), references[TINY])


def test_tei_routes_go_to_the_default_the_header_or_the_path_prefix(endpoint, references):
    url, _ = endpoint
    default = httpx.post(f"{url}/embed", json={"inputs": TEXTS}, timeout=60)
    by_header = httpx.post(
        f"{url}/embed", json={"inputs": TEXTS}, headers={"X-Kembed-Model": TINY}, timeout=60
    )
    by_path = httpx.post(f"{url}/models/{TINY}/embed", json={"inputs": TEXTS}, timeout=60)
    assert matches(rows_of(default), references[MINILM])  # the first listed
    assert matches(rows_of(by_header), references[TINY])
    assert matches(rows_of(by_path), references[TINY])
    openai_by_path = httpx.post(f"{url}/models/{TINY}/v1/embeddings", json={"input": TEXTS}, timeout=60)
    assert matches(rows_of(openai_by_path), references[TINY])


def test_an_unknown_model_is_the_apis_own_404(endpoint):
    url, _ = endpoint
    openai = httpx.post(f"{url}/v1/embeddings", json={"input": ["a"], "model": "nope"}, timeout=30)
    assert openai.status_code == 404
    assert openai.json()["error"]["param"] == "model"
    assert "`nope` does not exist" in openai.json()["error"]["message"]
    tei = httpx.post(f"{url}/embed", json={"inputs": "a"}, headers={"X-Kembed-Model": "nope"}, timeout=30)
    assert tei.status_code == 404
    assert tei.json()["error_type"] == "Validation"
    cohere = httpx.post(
        f"{url}/v2/embed", json={"model": "nope", "texts": ["a"], "input_type": "search_query"}, timeout=30
    )
    assert cohere.status_code == 404 and "nope" in cohere.json()["message"]


def test_models_and_info_describe_each_model(endpoint):
    url, _ = endpoint
    listed = httpx.get(f"{url}/v1/models", timeout=30).json()["data"]
    assert [(m["id"], m["state"]) for m in listed] == [(MINILM, "serving"), (TINY, "serving")]
    minilm = httpx.get(f"{url}/info", timeout=30).json()
    tiny = httpx.get(f"{url}/info", headers={"X-Kembed-Model": TINY}, timeout=30).json()
    assert (minilm["served_model_name"], minilm["dimensions"]) == (MINILM, 384)
    assert (tiny["served_model_name"], tiny["dimensions"]) == (TINY, 64)
    assert minilm["tokenizer_digest"] != tiny["tokenizer_digest"]
    assert httpx.get(f"{url}/models/{TINY}/info", timeout=30).json()["served_model_name"] == TINY


def test_metrics_carry_each_model(endpoint):
    url, _ = endpoint
    httpx.post(f"{url}/v1/embeddings", json={"input": ["w1 w2"], "model": TINY}, timeout=60)
    text = httpx.get(f"{url}/metrics", timeout=30).text
    for model in (MINILM, TINY):
        assert f'kembed_gateway_info{{model="{model}"}} 1.0' in text
        assert f'kembed_gateway_serving_workers{{model="{model}"}} 1.0' in text
        assert f'kembed_gateway_request_tokens_count{{model="{model}"}}' in text
        assert f'kembed_gateway_held_requests{{model="{model}"}} 0.0' in text  # what wakes it at zero
    assert text.count("# TYPE kembed_gateway_request_tokens histogram") == 1  # one family for all


def test_one_models_worker_killed_the_other_keeps_serving(endpoint, references):
    url, workers = endpoint
    workers[TINY].popen.send_signal(signal.SIGKILL)
    workers[TINY].popen.wait(10)
    for _ in range(3):
        response = httpx.post(f"{url}/v1/embeddings", json={"input": TEXTS, "model": MINILM}, timeout=60)
        assert matches(rows_of(response), references[MINILM])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        states = {m["id"]: m["state"] for m in httpx.get(f"{url}/v1/models", timeout=30).json()["data"]}
        if states[TINY] == "unavailable":
            break
        time.sleep(0.2)
    assert states == {MINILM: "serving", TINY: "unavailable"}
    down = httpx.post(f"{url}/v1/embeddings", json={"input": TEXTS, "model": TINY}, timeout=60)
    assert down.status_code == 503, down.text
    assert httpx.get(f"{url}/ready", timeout=30).status_code == 503  # a model with no worker, none held
    response = httpx.post(f"{url}/embed", json={"inputs": TEXTS}, timeout=60)
    assert matches(rows_of(response), references[MINILM])


def test_each_model_refuses_a_worker_of_another_model(log_dir, tiny_dir, references):
    """The model check is per model: one tiny-bert worker listed under both models is refused by
    the model whose tokenizer is MiniLM's and serves the one it matches."""
    port = free_port()
    worker = start_worker(log_dir, tiny_dir, port)
    address = [f"127.0.0.1:{port}"]
    models = [
        {"model_dir": str(bundled_model_dir()), "name": "crossed", "worker_addresses": address},
        {"model_dir": str(tiny_dir), "worker_addresses": address},
    ]
    gateway_port = free_port()
    args = ["kembed.gateway", "--port", str(gateway_port), "--models", json.dumps(models)]
    gateway = spawn(f"gateway-{gateway_port}", args, log_dir)
    url = f"http://127.0.0.1:{gateway_port}"
    try:
        wait_ready(url, [worker, gateway], timeout_s=120, path="/health")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            states = {m["id"]: m["state"] for m in httpx.get(f"{url}/v1/models", timeout=10).json()["data"]}
            (crossed,) = httpx.get(f"{url}/info", timeout=10).json()["workers"]
            if states[TINY] == "serving" and crossed["refused"]:
                break
            time.sleep(0.2)
        assert states == {"crossed": "unavailable", TINY: "serving"}
        assert "tokenizer" in crossed["refused"]
        response = httpx.post(f"{url}/v1/embeddings", json={"input": TEXTS, "model": TINY}, timeout=60)
        assert matches(rows_of(response), references[TINY])
        refused = httpx.post(f"{url}/v1/embeddings", json={"input": TEXTS, "model": "crossed"}, timeout=60)
        assert refused.status_code == 503, refused.text  # never the tiny model's vectors
        assert httpx.get(f"{url}/ready", timeout=10).json()["refused_workers"] == 1
    finally:
        for proc in (gateway, worker):
            proc.stop()
