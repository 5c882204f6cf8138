"""`python -m kembed.gateway.golden` against two real worker processes, as the operator's golden Job
runs it, and the operator's judge on what it prints."""

import json
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
from processes import free_port

from kembed.gateway.golden import GOLDEN_TEXTS, weights_digest
from kembed.operator.rollout import golden
from kembed.worker.config import bundled_model_dir


def run_golden(model_dir, *targets: str, flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    command = [sys.executable, "-P", "-m", "kembed.gateway.golden", "--model", str(model_dir)]
    for target in targets:
        command += ["--target", target]
    return subprocess.run([*command, *flags], capture_output=True, text=True, timeout=120)


def serving_worker(log_dir, *flags: str):
    """A CPU worker on the bundled model with `flags`, once it answers Info."""
    import grpc
    from processes import spawn

    from kembed.proto import embedder_pb2 as pb
    from kembed.proto import embedder_pb2_grpc as pb_grpc

    port = free_port()
    worker = spawn(
        f"worker-golden-{port}",
        ["kembed.worker", "--port", str(port), "--metrics-port", "0", "--device", "cpu", *flags],
        log_dir,
    )
    deadline = time.monotonic() + 90
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        while True:
            try:
                pb_grpc.EmbedderStub(channel).Info(pb.InfoRequest(), timeout=2)
                return worker, f"127.0.0.1:{port}"
            except grpc.RpcError:
                if worker.popen.poll() is not None or time.monotonic() > deadline:
                    worker.stop()
                    pytest.fail(f"the worker did not serve:\n{worker.log.read_text()}")
                time.sleep(0.2)


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


def test_the_gateways_length_prompts_and_normalisation_are_checked_against_the_record(stack, log_dir):
    """The golden check answers as the revision's gateway would: with its maximum length and prompts
    (the operator passes the gateway's settings), normalised as the pods say. Each of a length of 16,
    a changed prompt and normalisation turned off, on the same weights, fails against the record;
    before, each was promoted (embedded with the model directory alone, raw rows, cosine only)."""
    kept = golden.from_log(run_golden(bundled_model_dir(), *stack.workers).stdout)
    assert kept.has_norms and {name for name, _ in kept.prompted} >= {"query", "document"}
    norms = np.linalg.norm(np.asarray(kept.rows), axis=1)
    assert np.allclose(norms, 1.0, atol=1e-4), norms  # MiniLM's pipeline normalises: as clients get it

    short = run_golden(bundled_model_dir(), stack.workers[0], flags=("--max-seq-length", "16"))
    assert short.returncode == 0, short.stdout + short.stderr
    verdict = golden.judge(golden.from_log(short.stdout), kept, "Check", 0.999)
    assert not verdict.passed and "against the record (need >= 0.999)" in verdict.message, verdict.message

    prompts = ("--prompts", json.dumps({"query": "query: "}))
    prompted = run_golden(bundled_model_dir(), stack.workers[0], flags=prompts)
    verdict = golden.judge(golden.from_log(prompted.stdout), kept, "Check", 0.999)
    assert not verdict.passed and "under prompt 'query'" in verdict.message, verdict.message

    worker, address = serving_worker(log_dir, "--no-normalize")
    try:
        raw = run_golden(bundled_model_dir(), address)
    finally:
        worker.stop()
    assert raw.returncode == 0, raw.stdout + raw.stderr
    verdict = golden.judge(golden.from_log(raw.stdout), kept, "Check", 0.999)
    assert not verdict.passed and "has norm" in verdict.message, verdict.message

    bad = run_golden(bundled_model_dir(), stack.workers[0], flags=("--prompts", "[1]"))
    assert bad.returncode == 2 and "prompts must be a JSON object" in bad.stderr
