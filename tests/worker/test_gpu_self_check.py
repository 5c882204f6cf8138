"""A GPU worker gates itself before it opens its ports (`pytest -m gpu`): a few captured buckets
replayed against eager runs on fixed inputs; it serves when they match and exits 2 naming the
buckets when they do not (NaN weights), so a pod added after its rollout is gated too. The real
`kembed-worker` command, as a pod runs it."""

import subprocess
import sys
import time

import pytest
import torch
from local_ports import free_port
from safetensors.torch import load_file, save_file
from st_pipeline import write_random_minilm

pytestmark = pytest.mark.gpu


def start(model, log) -> subprocess.Popen:
    args = ["--model", str(model), "--device", "cuda", "--port", str(free_port()), "--metrics-port", "0"]
    args += ["--prewarm", "all", "--data-port", "-1"]
    return subprocess.Popen(
        [sys.executable, "-P", "-m", "kembed.worker", *args], stdout=log, stderr=subprocess.STDOUT
    )


def test_a_gpu_worker_replays_captured_buckets_before_it_serves_and_refuses_nan_weights(tmp_path):
    good, bad = tmp_path / "good", tmp_path / "bad"
    write_random_minilm(good)
    write_random_minilm(bad)
    weights = load_file(bad / "model.safetensors")
    save_file({k: torch.full_like(v, float("nan")) for k, v in weights.items()}, bad / "model.safetensors")
    logs = {name: tmp_path / f"{name}.log" for name in ("good", "bad")}
    with logs["good"].open("wb") as log:
        worker = start(good, log)
        try:
            deadline = time.monotonic() + 240
            while "worker serving" not in logs["good"].read_text():
                assert worker.poll() is None, logs["good"].read_text()[-3000:]
                assert time.monotonic() < deadline, "the worker never served"
                time.sleep(0.5)
        finally:
            worker.terminate()
            worker.wait(30)
    text = logs["good"].read_text()
    assert "self-check passed: 3 captured buckets replayed against eager runs" in text, text[-3000:]
    with logs["bad"].open("wb") as log:
        assert start(bad, log).wait(300) == 2
    text = logs["bad"].read_text()
    assert "self-check failed: graph replay does not match eager runs" in text, text[-3000:]
    print([line for line in text.splitlines() if "self-check" in line])
