"""A gateway serves only through workers of the model it tokenizes for. Real processes: a gateway on
the bundled model and workers on copies that differ where a user's setup differs (a cased tokenizer,
a permuted vocabulary, a longer max_seq_length, other weights): each answered 200 with wrong vectors
(cosine 0.08-0.88) before. Now each is refused with its reason in /info, the log and a metric;
requests go only to the worker of the right model and match sentence-transformers; with none left
/ready is 503. A gateway whose directory holds no weights (a gateway pod fetches all but them) holds
later replicas to the weights of those serving."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from corpus import mixed_lengths
from processes import Process, free_port, spawn, wait_ready

from kembed.worker.config import bundled_model_dir

pytestmark = pytest.mark.slow


def copy_of(root: Path, name: str) -> Path:
    target = root / name
    shutil.copytree(bundled_model_dir(), target)
    return target


def cased(root: Path) -> Path:
    """The bundled model whose tokenizer no longer lowercases: every capitalised word splits otherwise."""
    target = copy_of(root, "cased")
    tokenizer = json.loads((target / "tokenizer.json").read_text())
    tokenizer["normalizer"]["lowercase"] = False
    (target / "tokenizer.json").write_text(json.dumps(tokenizer))
    return target


def permuted(root: Path) -> Path:
    """The bundled model with two ordinary words' ids swapped in its vocabulary."""
    target = copy_of(root, "permuted")
    tokenizer = json.loads((target / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    vocab["cat"], vocab["dog"] = vocab["dog"], vocab["cat"]
    (target / "tokenizer.json").write_text(json.dumps(tokenizer))
    return target


def longer(root: Path) -> Path:
    """The bundled model whose sentence-transformers config says 512 tokens, not 256."""
    target = copy_of(root, "longer")
    (target / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": 512, "do_lower_case": False})
    )
    return target


def other_weights(root: Path) -> Path:
    """The bundled model's weights with one layer's attention output scaled: same shapes, other vectors."""
    from safetensors.numpy import load_file, save_file

    target = copy_of(root, "other-weights")
    tensors = load_file(target / "model.safetensors")
    name = next(k for k in tensors if k.endswith("attention.output.dense.weight"))
    tensors[name] = tensors[name] * 1.5
    save_file(tensors, target / "model.safetensors")
    return target


def without_weights(root: Path) -> Path:
    """What a gateway pod fetches: the bundled directory but its weights."""
    target = copy_of(root, "tokenizer-only")
    (target / "model.safetensors").unlink()
    return target


def worker(log_dir: Path, model_dir: Path, port: int | None = None) -> tuple[str, Process]:
    port = port or free_port()
    args = [
        "kembed.worker",
        "--port",
        str(port),
        "--metrics-port",
        "0",
        "--device",
        "cpu",
        "--model",
        str(model_dir),
    ]
    return f"127.0.0.1:{port}", spawn(f"worker-{model_dir.name}-{port}", args, log_dir)


def gateway(log_dir: Path, addresses: list[str], model_dir: Path | None = None) -> tuple[str, Process]:
    port = free_port()
    args = ["kembed.gateway", "--port", str(port), *(f"--worker={a}" for a in addresses)]
    if model_dir is not None:
        args += ["--model", str(model_dir)]
    return f"http://127.0.0.1:{port}", spawn(f"gateway-{port}", args, log_dir)


def settled(
    url: str, addresses: list[str], processes: list[Process], timeout_s: float = 90
) -> dict[str, dict]:
    """The gateway's view of each worker once every one is serving or refused."""
    wait_ready(url, processes, timeout_s, path="/health")
    deadline = time.monotonic() + timeout_s
    workers: dict[str, dict] = {}
    while time.monotonic() < deadline:
        workers = {w["address"]: w for w in httpx.get(f"{url}/info", timeout=5).json()["workers"]}
        if all(workers[a]["serving"] or workers[a]["refused"] for a in addresses):
            return workers
        time.sleep(0.2)
    logs = "\n".join(f"--- {p.name}\n{p.log.read_text()}" for p in processes)
    pytest.fail(f"workers not settled after {timeout_s}s: {workers}\n{logs}")


def refused_gauge(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    return float(re.search(r"^kembed_gateway_refused_workers (\S+)$", text, re.M).group(1))


def test_workers_of_other_models_are_refused_and_only_the_right_one_answers(log_dir, tmp_path, reference):
    variants = {"cased": cased, "permuted": permuted, "longer": longer, "other-weights": other_weights}
    reasons = {
        "cased": "its tokenizer",
        "permuted": "its tokenizer",
        "longer": "its tokenizer",
        "other-weights": "its weights and configs",
    }
    started = {name: worker(log_dir, make(tmp_path)) for name, make in variants.items()}
    right_address, right = worker(log_dir, bundled_model_dir())
    addresses = [a for a, _ in started.values()] + [right_address]
    url, gate = gateway(log_dir, addresses)
    processes = [p for _, p in started.values()] + [right, gate]
    try:
        workers = settled(url, addresses, processes)
        assert workers[right_address]["serving"] and not workers[right_address]["refused"], workers
        own = httpx.get(f"{url}/info", timeout=5).json()  # the worker computed what the gateway did
        assert own["tokenizer_digest"] == workers[right_address]["tokenizer_digest"], workers
        assert own["model_digest"] == workers[right_address]["model_digest"] is not None, workers
        for name, (address, _) in started.items():
            view = workers[address]
            assert not view["serving"], (name, view)
            assert view["refused"].startswith("serves another model"), (name, view)
            assert reasons[name] in view["refused"], (name, view)
        log = gate.log.read_text()
        assert log.count("refused: serves another model") == len(variants), log
        assert refused_gauge(url) == len(variants)
        # Every answer comes from the right worker: what sentence-transformers gives, capitals and
        # the swapped words included, over a request split into chunks.
        texts = ["The Cat sat on the mat", "A dog and a cat", *mixed_lengths(40, seed=7, max_words=300)]
        response = httpx.post(
            f"{url}/v1/embeddings", json={"input": texts, "encoding_format": "float"}, timeout=60
        )
        assert response.status_code == 200, response.text
        got = np.array([d["embedding"] for d in response.json()["data"]], dtype=np.float32)
        assert (got * reference.encode(texts)).sum(1).min() >= 0.999
        served = {w["address"]: w["num_chunks_served"] for w in httpx.get(f"{url}/info").json()["workers"]}
        assert served[right_address] > 0 and all(served[a] == 0 for a, _ in started.values()), served
        # With the right worker gone, nothing is left to serve: /ready says so, requests are refused.
        right.stop()
        deadline = time.monotonic() + 30
        while httpx.get(f"{url}/ready", timeout=5).status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        ready = httpx.get(f"{url}/ready", timeout=5)
        assert ready.status_code == 503 and ready.json()["refused_workers"] == len(variants), ready.text
        failed = httpx.post(f"{url}/v1/embeddings", json={"input": "The Cat"}, timeout=30)
        assert failed.status_code == 503, failed.text
    finally:
        for process in processes:
            process.stop()


def test_a_gateway_without_weights_holds_workers_to_the_weights_serving(log_dir, tmp_path, reference):
    """Its tokenizer digest it checks itself; the weights' it cannot: the first worker's are what the
    later one is held to (with the same tokenizer, so only the weights tell them apart)."""
    first_address, first = worker(log_dir, bundled_model_dir())
    later_port = free_port()
    later_address = f"127.0.0.1:{later_port}"
    url, gate = gateway(log_dir, [first_address, later_address], without_weights(tmp_path))
    processes = [first, gate]
    try:
        wait_ready(url, processes)
        info = httpx.get(f"{url}/info", timeout=5).json()
        assert info["model_digest"] is None and info["tokenizer_digest"].startswith("sha256:"), info
        processes.append(worker(log_dir, other_weights(tmp_path), later_port)[1])
        workers = settled(url, [first_address, later_address], processes)
        assert workers[first_address]["serving"], workers
        refusal = workers[later_address]["refused"]
        assert refusal and "other weights than the replicas serving" in refusal, workers
        texts = mixed_lengths(12, seed=3, max_words=40)
        response = httpx.post(
            f"{url}/v1/embeddings", json={"input": texts, "encoding_format": "float"}, timeout=60
        )
        assert response.status_code == 200, response.text
        got = np.array([d["embedding"] for d in response.json()["data"]], dtype=np.float32)
        assert (got * reference.encode(texts)).sum(1).min() >= 0.999
    finally:
        for process in processes:
            process.stop()
