"""BGE-M3's heads as the worker serves them and check-model reports them: each head found is named
with what it gives, `/embed_sparse` is listed only where there is a sparse head, and a head the
worker cannot serve refuses the model at start, naming it, in check-model, in the engine and in a
real `kembed-worker` process. Before, a `colbert_linear` of another width than the dense vectors was
dropped without a word: check-model said servable, `outputs: ["colbert"]` was then refused."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from m3_model import build_m3_dir

from kembed.worker.config import WorkerConfig, bundled_model_dir
from kembed.worker.engine import load_engine
from kembed.worker.errors import InvalidInput
from kembed.worker.tools.check_model import check, render

HIDDEN = 32


def with_colbert(path: Path, out: int) -> Path:
    build_m3_dir(path)
    torch.save({"weight": torch.randn(out, HIDDEN), "bias": torch.zeros(out)}, path / "colbert_linear.pt")
    return path


def test_check_model_names_the_heads_it_found_and_the_outputs_and_routes_they_give(tmp_path):
    result = check(build_m3_dir(tmp_path / "m3"), load=True)
    assert result.is_servable, result.reason
    assert result.heads == ["sparse_linear: 32 -> 1 (sparse)", "colbert_linear: 32 -> 32 (colbert)"]
    assert result.outputs == ["dense", "sparse", "colbert", "tokens"]
    assert {"POST /embed_sparse", "POST /embed_all"} <= set(result.routes)
    report = render(result)
    assert re.search(r"\nheads +sparse_linear: 32 -> 1 \(sparse\); colbert_linear", report), report
    assert re.search(r"\noutputs +dense, sparse, colbert, tokens\n", report), report


def test_a_model_without_a_sparse_head_has_no_embed_sparse_route(tmp_path):
    bundled = check(bundled_model_dir())
    assert bundled.heads == [] and bundled.outputs == ["dense", "tokens"]
    assert "POST /embed_sparse" not in bundled.routes and "POST /embed_all" in bundled.routes
    path = build_m3_dir(tmp_path / "m3")
    (path / "sparse_linear.safetensors").unlink()
    colbert_only = check(path)
    assert colbert_only.outputs == ["dense", "colbert", "tokens"]
    assert "POST /embed_sparse" not in colbert_only.routes


def test_a_colbert_head_of_another_width_is_refused_by_check_model_and_the_engine(tmp_path):
    path = with_colbert(tmp_path / "m3", out=16)
    result = check(path)
    assert not result.is_servable
    assert result.reason.startswith(
        "colbert_linear gives vectors of 16 values, the model's dense vectors have 32"
    )
    with pytest.raises(InvalidInput) as refused:
        load_engine(WorkerConfig(model=path, device="cpu"))
    assert str(refused.value) == result.reason  # the worker's own rule


def test_a_sparse_head_of_several_weights_a_token_is_refused(tmp_path):
    from safetensors.torch import save_file

    path = build_m3_dir(tmp_path / "m3")
    save_file(
        {"weight": torch.randn(2, HIDDEN), "bias": torch.zeros(2)}, str(path / "sparse_linear.safetensors")
    )
    assert check(path).reason.startswith("sparse_linear gives 2 weights a token")


def test_a_worker_started_on_it_exits_naming_the_head(tmp_path):
    path = with_colbert(tmp_path / "m3", out=16)
    done = subprocess.run(
        [sys.executable, "-P", "-m", "kembed.worker", "--model", str(path), "--device", "cpu", "--port", "0"],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode != 0
    assert "colbert_linear gives vectors of 16 values" in done.stdout + done.stderr
    cli = subprocess.run(
        [sys.executable, "-P", "-m", "kembed.worker", "check-model", str(path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert cli.returncode == 1 and "not servable: colbert_linear gives vectors of 16" in cli.stdout
