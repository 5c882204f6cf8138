"""End-to-end fixtures: real worker and gateway processes on free localhost ports, and the reference.

One stack (two worker replicas behind one gateway) is shared by the whole e2e session: starting
processes is the slow part. Each process logs to a file that a failing start prints.
"""

import json
import shutil
from pathlib import Path

import httpx
import pytest
from processes import CROSS_ENCODER_MAX_LENGTH, PROMPTS, start_stack

from kembed.worker.config import bundled_model_dir


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("logs")


@pytest.fixture(scope="session")
def stack(log_dir):
    """Two CPU worker replicas behind one gateway, all real processes, on the bundled model."""
    started = start_stack(log_dir, num_workers=2)
    yield started
    for proc in started.processes:
        proc.stop()


@pytest.fixture(scope="session")
def prompt_model_dir(tmp_path_factory) -> Path:
    """The bundled model with query/passage prompts, as models like E5 or BGE ship them."""
    target = tmp_path_factory.mktemp("prompted") / "all-MiniLM-L6-v2-prompted"
    shutil.copytree(bundled_model_dir(), target)
    config_file = target / "config_sentence_transformers.json"
    config = json.loads(config_file.read_text())
    config.update(prompts=PROMPTS, default_prompt_name=None)
    config_file.write_text(json.dumps(config))
    return target


@pytest.fixture(scope="session")
def prompt_gateway(stack, log_dir, prompt_model_dir):
    """A second gateway over the same workers whose model directory carries prompts."""
    started = start_stack(log_dir, num_workers=0, model_dir=prompt_model_dir, worker_addresses=stack.workers)
    yield started
    for proc in started.processes:
        proc.stop()


@pytest.fixture(scope="session")
def reference():
    """sentence-transformers on the same bundled directory: what kembed must agree with."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(bundled_model_dir()), device="cpu")


@pytest.fixture
def client(stack):
    with httpx.Client(base_url=stack.url, timeout=60) as http:
        yield http


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


@pytest.fixture(scope="session")
def cross_encoder_dir(tmp_path_factory) -> Path:
    """A random tiny BertForSequenceClassification (one label) with the bundled MiniLM tokenizer, whose
    vocabulary (30522) the model's matches. max_position_embeddings caps both sides at 128 tokens."""
    import torch
    import transformers

    target = tmp_path_factory.mktemp("cross-encoder") / "tiny-bert-reranker"
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=CROSS_ENCODER_MAX_LENGTH,
        num_labels=1,
        initializer_range=0.2,  # spreads the random logits so rankings are well separated
    )
    transformers.BertForSequenceClassification(config).eval().save_pretrained(target)
    for name in TOKENIZER_FILES:
        shutil.copy(bundled_model_dir() / name, target / name)
    assert json.loads((target / "config.json").read_text())["vocab_size"] == len(
        (target / "vocab.txt").read_text(encoding="utf-8").splitlines()
    )
    return target


@pytest.fixture(scope="session")
def rerank_stack(log_dir, cross_encoder_dir):
    """Two cross-encoder workers behind one gateway; small chunks so a request spans both."""
    started = start_stack(
        log_dir,
        num_workers=2,
        model_dir=cross_encoder_dir,
        worker_model_dir=cross_encoder_dir,
        gateway_args=("--chunk-tokens", "512", "--max-chunk-sequences", "16"),
    )
    yield started
    for proc in started.processes:
        proc.stop()
