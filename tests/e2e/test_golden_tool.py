"""`python -m kembed.gateway.golden` against two real worker processes, as the operator's golden Job
runs it, and the operator's judge on what it prints."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
from processes import free_port

from kembed.gateway.golden import GOLDEN_TEXTS, weights_digest
from kembed.operator.rollout import golden
from kembed.worker.config import bundled_model_dir


def run_golden(model_dir, *targets: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-P", "-m", "kembed.gateway.golden", "--model", str(model_dir)]
    for target in targets:
        command += ["--target", target]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def default_prompt_dir(tmp_path_factory):
    """The same weights with a default prompt: the gateway would tokenize every text otherwise."""
    target = tmp_path_factory.mktemp("golden") / "all-MiniLM-L6-v2"
    shutil.copytree(bundled_model_dir(), target)
    config_file = target / "config_sentence_transformers.json"
    config = json.loads(config_file.read_text())
    config.update(prompts={"query": "query: "}, default_prompt_name="query")
    config_file.write_text(json.dumps(config))
    return target


def test_two_workers_agree_the_record_matches_the_reference_and_a_tokenizer_change_is_caught(
    stack, reference, default_prompt_dir
):
    done = run_golden(bundled_model_dir(), *stack.workers)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("ok   golden") == 2  # each pod against the first
    record = golden.from_log(done.stdout)
    assert record.task == "embed" and len(record.rows) == len(GOLDEN_TEXTS)
    assert record.weights == weights_digest(bundled_model_dir())
    expected = reference.encode(list(GOLDEN_TEXTS), normalize_embeddings=True)
    got = np.asarray(record.rows)
    cosines = (got * expected).sum(1) / np.linalg.norm(got, axis=1)
    assert cosines.min() >= 0.999, cosines

    again = golden.from_log(run_golden(bundled_model_dir(), stack.workers[1]).stdout)
    assert golden.judge(again, record, "Check", 0.999).passed

    # Same weights (same digest), another tokenization: the record of those weights catches it.
    prompted = run_golden(default_prompt_dir, *stack.workers)
    assert prompted.returncode == 0, prompted.stdout + prompted.stderr
    changed = golden.from_log(prompted.stdout)
    assert changed.weights == record.weights
    verdict = golden.judge(changed, record, "Check", 0.999)
    assert not verdict.passed and "golden text" in verdict.message


def test_a_model_directory_without_weights_or_a_dead_worker_is_a_one_line_error(stack, tmp_path):
    empty = tmp_path / "empty"
    shutil.copytree(bundled_model_dir(), empty, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    no_weights = run_golden(empty, stack.workers[0])
    assert no_weights.returncode == 2 and "no weight files" in no_weights.stderr
    assert "Traceback" not in no_weights.stderr and len(no_weights.stderr.strip().splitlines()) == 1
    dead = run_golden(bundled_model_dir(), f"127.0.0.1:{free_port()}")
    assert dead.returncode == 2 and "unreachable" in dead.stderr and "Traceback" not in dead.stderr


def test_a_pod_of_another_model_fails_the_golden_check_before_its_answers_are_compared(
    stack, log_dir, tmp_path
):
    """The gateway's own model check (model_check.py) runs in the golden Job: a candidate pod whose
    tokenizer is not the gateway's fails it, naming why, even where its vectors look plausible."""
    from processes import spawn, wait_ready

    cased = tmp_path / "cased"
    shutil.copytree(bundled_model_dir(), cased)
    tokenizer = json.loads((cased / "tokenizer.json").read_text())
    tokenizer["normalizer"]["lowercase"] = False
    (cased / "tokenizer.json").write_text(json.dumps(tokenizer))
    port = free_port()
    worker = spawn(
        f"worker-cased-{port}",
        [
            "kembed.worker",
            "--port",
            str(port),
            "--metrics-port",
            "0",
            "--device",
            "cpu",
            "--model",
            str(cased),
        ],
        log_dir,
    )
    try:
        gateway_port = free_port()  # a throwaway gateway only to wait until the worker serves
        gateway = spawn(
            f"gateway-{gateway_port}",
            [
                "kembed.gateway",
                "--port",
                str(gateway_port),
                "--model",
                str(cased),
                "--worker",
                f"127.0.0.1:{port}",
            ],
            log_dir,
        )
        try:
            wait_ready(f"http://127.0.0.1:{gateway_port}", [worker, gateway])
        finally:
            gateway.stop()
        done = run_golden(bundled_model_dir(), stack.workers[0], f"127.0.0.1:{port}")
    finally:
        worker.stop()
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"FAIL golden 127.0.0.1:{port}: serves another model: its tokenizer" in done.stdout, done.stdout
    assert "kembed-golden-record" not in done.stdout
