"""`python -m kembed.worker stats|prewarm|smoke` against real worker processes, as operator Jobs run them."""

import json
import subprocess
import sys

import httpx
import pytest
from processes import free_port, spawn, start_stack


@pytest.fixture(scope="module")
def worker(log_dir):
    stack = start_stack(log_dir, num_workers=1)
    yield stack
    for proc in stack.processes:
        proc.stop()


def admin(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-P", "-m", "kembed.worker", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_prewarm_carries_over_the_serving_workers_hot_buckets_then_smoke_passes(worker, log_dir):
    address = worker.workers[0]
    for _ in range(3):  # traffic: two sequences of 3 and 2 tokens land in bucket 2x64
        assert httpx.post(f"{worker.url}/embed", json={"inputs": ["a b", "c"]}, timeout=30).status_code == 200
    stats = admin("stats", "--target", address)
    assert stats.returncode == 0 and "2x64" in stats.stdout
    candidate_port = free_port()
    candidate = spawn(
        f"candidate-{candidate_port}", ["kembed.worker", "--port", str(candidate_port)], log_dir
    )
    try:
        target = f"127.0.0.1:{candidate_port}"
        # the candidate is still loading: wait for it as long as for the call (not the 10 s default)
        prewarm = admin("prewarm", "--target", target, "--buckets", "1x128,4x512", "--hot-from", address,
                        "--hot", "1", "--timeout", "60", "--connect-timeout", "60")  # fmt: skip
        assert prewarm.returncode == 0, prewarm.stdout + prewarm.stderr
        assert "captured 1x128, 4x512, 2x64" in prewarm.stdout
        smoke = admin("smoke", "--target", target, "--timeout", "60")
        assert smoke.returncode == 0, smoke.stdout + smoke.stderr
        assert "PASSED (3 buckets)" in smoke.stdout
    finally:
        candidate.stop()


def test_unreachable_worker_and_bad_bucket_exit_2_with_a_message(worker):
    dead = admin("smoke", "--target", f"127.0.0.1:{free_port()}", "--timeout", "2")
    assert dead.returncode == 2 and "unreachable" in dead.stderr
    bad = admin("smoke", "--target", worker.workers[0], "--buckets", "8x4")
    assert bad.returncode == 2 and "not one of this worker's" in bad.stderr
    usage = admin("smoke", "--target", worker.workers[0], "--buckets", "eight")
    assert usage.returncode == 2 and "SEQSxTOKENS" in usage.stderr


def test_smoke_checks_golden_embeddings_and_fails_on_a_wrong_one(worker, reference, tmp_path):
    texts = ["golden query one", "a second, longer golden document about vectors"]
    token_ids = reference.tokenizer(texts)["input_ids"]
    expected = reference.encode(texts)  # sentence-transformers on the same weights: an independent reference
    golden = tmp_path / "golden"
    golden.mkdir()
    (golden / "minilm.json").write_text(json.dumps({"token_ids": token_ids, "embeddings": expected.tolist()}))
    passed = admin("smoke", "--target", worker.workers[0], "--golden", str(golden))
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "ok   golden minilm.json: 2 sequences" in passed.stdout
    (golden / "swapped.json").write_text(
        json.dumps({"token_ids": token_ids, "embeddings": expected[::-1].tolist()})
    )
    failed = admin("smoke", "--target", worker.workers[0], "--golden", str(golden))
    assert failed.returncode == 1 and "FAIL golden swapped.json" in failed.stdout
    broken = admin("smoke", "--target", worker.workers[0], "--golden", str(tmp_path / "missing.json"))
    assert broken.returncode == 2 and "golden" in broken.stderr


def test_smoke_fails_a_worker_serving_on_another_device_than_asked(worker):
    """The operator asks `--expect-device cuda` of a GPU pod: one that serves on its CPU (a driver
    mismatch under device auto) fails the gate, with what it serves on."""
    on_cpu = admin("smoke", "--target", worker.workers[0], "--expect-device", "cuda", "--buckets", "1x128")
    assert on_cpu.returncode == 1 and "serves on 'cpu', not 'cuda'" in on_cpu.stdout
    assert (
        admin(
            "smoke", "--target", worker.workers[0], "--expect-device", "cpu", "--buckets", "1x128"
        ).returncode
        == 0
    )
