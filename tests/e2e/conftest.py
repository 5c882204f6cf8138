"""End-to-end fixtures: real worker and gateway processes on free localhost ports, and the reference.

One stack (two worker replicas behind one gateway) is shared by the whole e2e session: starting
processes is the slow part. Each process logs to a file that a failing start prints.
"""

import json
import shutil
from pathlib import Path

import httpx
import pytest
from processes import PROMPTS, start_stack

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
