"""jina-embeddings-v3's task adapters chosen per request through a real gateway and worker: a tiny
model in Jina's own checkpoint format (every linear and embedding with per-task LoRA factors), its
prompts named as its tasks. Each request's `task` (Jina's API field) or `prompt_name` picks the
adapter and the instruction; requests of different tasks at once (sharing the worker's batches)
each get their own task's vectors, against sentence-transformers on the weights with that task
merged (what Jina's LoRA parametrization computes)."""

import asyncio
import shutil
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
import transformers
from processes import start_stack

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "worker"))
from encoder_dirs import (
    VOCAB_SIZE,
    cosine_rows,
    jina_own_format,
    randomise_norms,
    save_sentence_transformer,
    texts,
)

TASKS = ["retrieval.query", "retrieval.passage", "text-matching"]
PROMPTS = {"retrieval.query": "Represent the query: ", "retrieval.passage": "Represent the document: ",
           "text-matching": ""}  # fmt: skip
TEXTS = texts(5)
MIN_COSINE = 0.999


@pytest.fixture(scope="module")
def jina(tmp_path_factory):
    """(Jina's own format directory, the reference's vectors by (task, prompt name))."""
    from safetensors.torch import save_file
    from sentence_transformers import SentenceTransformer

    base = tmp_path_factory.mktemp("jina-tasks")
    config = transformers.JinaEmbeddingsV3Config(
        vocab_size=VOCAB_SIZE, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=96, initializer_range=0.2, max_position_embeddings=256,
        rope_parameters={"rope_type": "default", "rope_theta": 100.0},
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.JinaEmbeddingsV3Model(config).eval()
    randomise_norms(model)
    native = save_sentence_transformer(base / "native", model, "roberta", "mean", prompts=PROMPTS)
    merged = jina_own_format(native, base / "tiny-jina-v3", TASKS, theta=100.0)
    references = {("", None): SentenceTransformer(str(native), device="cpu").encode(TEXTS)}
    for task, state in merged.items():
        task_dir = base / f"merged-{task}"
        shutil.copytree(native, task_dir)
        save_file(state, task_dir / "model.safetensors")
        encoder = SentenceTransformer(str(task_dir), device="cpu")
        references[(task, task)] = encoder.encode(TEXTS, prompt_name=task)
        references[(task, None)] = encoder.encode(TEXTS)
    for task in TASKS:  # the adapters change the vectors of these texts
        assert cosine_rows(references[(task, None)], references[("", None)]).max() < MIN_COSINE
    return base / "tiny-jina-v3", references


@pytest.fixture(scope="module")
def jina_stack(log_dir, jina):
    own, _ = jina
    started = start_stack(log_dir, num_workers=1, model_dir=own, worker_model_dir=own)
    yield started
    for proc in started.processes:
        proc.stop()


def rows_of(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    return np.array([item["embedding"] for item in response.json()["data"]], np.float32)


def embed(url: str, **body) -> np.ndarray:
    return rows_of(httpx.post(f"{url}/v1/embeddings", json={"input": TEXTS, **body}, timeout=60))


@pytest.mark.parametrize("task", TASKS)
def test_task_picks_its_adapter_and_its_instruction(jina_stack, jina, task):
    _, references = jina
    assert cosine_rows(embed(jina_stack.url, task=task), references[(task, task)]).min() >= MIN_COSINE


@pytest.mark.parametrize("task", TASKS)
def test_a_prompt_name_that_is_a_task_picks_that_adapter(jina_stack, jina, task):
    _, references = jina
    rows = embed(jina_stack.url, prompt_name=task)
    assert cosine_rows(rows, references[(task, task)]).min() >= MIN_COSINE
    tei = httpx.post(f"{jina_stack.url}/embed", json={"inputs": TEXTS, "prompt_name": task}, timeout=60)
    assert tei.status_code == 200, tei.text
    assert cosine_rows(np.array(tei.json(), np.float32), references[(task, task)]).min() >= MIN_COSINE


def test_task_without_its_instruction_when_prompt_name_says_another(jina_stack, jina):
    _, references = jina
    rows = embed(jina_stack.url, task="retrieval.passage", prompt_name="text-matching")  # "" prompt
    assert cosine_rows(rows, references[("retrieval.passage", None)]).min() >= MIN_COSINE


def test_no_task_is_the_base_model(jina_stack, jina):
    _, references = jina
    assert cosine_rows(embed(jina_stack.url), references[("", None)]).min() >= MIN_COSINE


def test_requests_of_every_task_at_once_each_get_their_own(jina_stack, jina):
    """Twelve requests in flight together, three tasks and none: the worker batches them together."""
    _, references = jina
    picks = [TASKS[i % 3] if i % 4 else None for i in range(12)]

    async def main() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            sends = [
                client.post(f"{jina_stack.url}/v1/embeddings", json={"input": TEXTS, "task": task})
                for task in picks
            ]
            return await asyncio.gather(*sends)

    for task, response in zip(picks, asyncio.run(main()), strict=True):
        want = references[(task, task)] if task else references[("", None)]
        assert cosine_rows(rows_of(response), want).min() >= MIN_COSINE, task


def test_unknown_task_is_a_400_naming_the_tasks_and_info_lists_them(jina_stack):
    response = httpx.post(
        f"{jina_stack.url}/v1/embeddings", json={"input": TEXTS, "task": "classification"}, timeout=60
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "task"
    assert "retrieval.query, retrieval.passage, text-matching" in error["message"]
    info = httpx.get(f"{jina_stack.url}/info", timeout=10).json()
    assert info["tasks"] == TASKS and info["default_task"] is None


def test_task_on_a_model_without_adapters_is_a_400(stack):
    response = httpx.post(f"{stack.url}/v1/embeddings", json={"input": ["hi"], "task": "retrieval.query"})
    assert response.status_code == 400, response.text
    assert "has no task adapters" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("input_type", "task"), [("search_query", "retrieval.query"), ("search_document", "retrieval.passage")]
)
def test_cohere_input_type_picks_the_task_of_that_use(jina_stack, jina, input_type, task):
    _, references = jina
    body = {"model": "tiny-jina-v3", "texts": TEXTS, "input_type": input_type, "embedding_types": ["float"]}
    response = httpx.post(f"{jina_stack.url}/v2/embed", json=body, timeout=60)
    assert response.status_code == 200, response.text
    rows = np.array(response.json()["embeddings"]["float"], np.float32)
    assert cosine_rows(rows, references[(task, task)]).min() >= MIN_COSINE
