"""`--linear-dtype fp8` on a GPU with fp8 tensor cores (`pytest -m gpu`; CI has none).

The kernels against their plain-torch forms (fp8.py), the fp8 engine's embeddings of the real
all-MiniLM-L6-v2 against transformers in float32 (min cosine >= 0.98: below kembed's 0.999 bar,
which is why fp8 is an opt-in) eagerly, captured and replayed, beside the interactive lane, and
BGE-M3 and Qwen3 shapes against their own bf16 engine.
"""

import asyncio
import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from real_minilm import CARRY_HINT, float32_rows, real_minilm_dir, tokenized_corpus

from kembed.worker.config import WorkerConfig
from kembed.worker.engine import load_engine
from kembed.worker.engine.cuda_engine import CudaEngine
from kembed.worker.engine.kernels.fp8 import (
    Fp8Linear,
    activation_quantize,
    activation_quantize_reference,
    dequantize,
    fp8_unsupported_reason,
    quantize_rows,
    quantize_rows_reference,
)
from kembed.worker.engine.kernels.fused import add_layer_norm, add_layer_norm_fp8
from kembed.worker.engine.kernels.fused_decoder import rms_norm, rms_norm_fp8
from kembed.worker.scheduling.queues import Priority
from kembed.worker.scheduling.scheduler import Scheduler

pytestmark = pytest.mark.gpu
CONFIGS = Path(__file__).resolve().parents[1] / "bench" / "configs"  # the benchmark models' shapes


@pytest.fixture(scope="module", autouse=True)
def fp8_gpu():
    reason = fp8_unsupported_reason(torch.device("cuda"))
    assert reason is None, reason


def assert_same_quantization(got, want) -> None:
    """Same scales; values equal but for the odd one rounded the other way (float32 division order)."""
    torch.testing.assert_close(got.scale, want.scale, rtol=1e-5, atol=0)
    same = (got.data.float() == want.data.float()).float().mean().item()
    assert same >= 0.99, f"only {same:.4f} of the e4m3 values agree"
    torch.testing.assert_close(
        dequantize(got), dequantize(want), rtol=2**-3, atol=float(want.scale.max()) * 2**-9
    )


def rows_with_outliers(num_rows: int, width: int, seed: int) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(num_rows, width, device="cuda", generator=gen) * 3
    x[::7, width // 3] = 80.0  # one loud channel in some rows
    if num_rows > 1:
        x[1] = 0.0  # an all-zero row (a bucket's padding can be one)
    return x.to(torch.bfloat16)


@pytest.mark.parametrize("width", [384, 1024, 4096, 12288], ids=lambda w: f"width{w}")
def test_quantize_rows_kernel_matches_reference(width):
    x = rows_with_outliers(200, width, seed=width)
    assert_same_quantization(quantize_rows(x), quantize_rows_reference(x))


@pytest.mark.parametrize("activation", ["gelu", "gelu_pytorch_tanh", "relu", "silu_mul"])
@pytest.mark.parametrize("width", [1536, 4096, 6144, 16384], ids=lambda w: f"width{w}")
def test_activation_quantize_kernel_matches_reference(activation, width):
    x = rows_with_outliers(130, width, seed=width + 1)
    got = activation_quantize(x, activation)
    assert got.data.shape == (130, width // 2 if activation == "silu_mul" else width)
    assert_same_quantization(got, activation_quantize_reference(x, activation))


@pytest.mark.parametrize("hidden", [384, 1024])
def test_add_layer_norm_fp8_also_writes_the_rows_quantized(hidden):
    x, residual = rows_with_outliers(100, hidden, 1), rows_with_outliers(100, hidden, 2)
    norm = torch.nn.LayerNorm(hidden, device="cuda", dtype=torch.bfloat16)
    torch.nn.init.normal_(norm.weight, 1.0, 0.2)
    torch.nn.init.normal_(norm.bias, 0.0, 0.2)
    with torch.inference_mode():
        out, rows = add_layer_norm_fp8(x, residual, norm)
        torch.testing.assert_close(out, add_layer_norm(x, residual, norm))
        # the kernel quantises the float32 rows, the reference their bf16 rounding: a step apart at most
        want = quantize_rows_reference(out)
        torch.testing.assert_close(rows.scale, want.scale, rtol=2**-7, atol=0)
        torch.testing.assert_close(
            dequantize(rows), out.float(), rtol=2**-3, atol=float(rows.scale.max()) * 2**-9
        )


@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
def test_rms_norm_fp8_also_writes_the_rows_quantized(with_residual):
    x, residual = rows_with_outliers(100, 1024, 3), rows_with_outliers(100, 1024, 4)
    weight = (torch.randn(1024, device="cuda") * 0.2 + 1).to(torch.bfloat16)
    rows, total = rms_norm_fp8(x, weight, 1e-6, residual=residual if with_residual else None)
    out, want_total = rms_norm(x, weight, 1e-6, residual=residual if with_residual else None)
    torch.testing.assert_close(total, want_total)
    # the kernel quantises the float32 rows, the reference their bf16 rounding: a step apart at most
    torch.testing.assert_close(
        dequantize(rows), out.float(), rtol=2**-3, atol=float(rows.scale.max()) * 2**-9
    )


@pytest.mark.parametrize("has_bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("num_tokens", [1, 77, 512])
def test_scaled_mm_is_the_dequantized_product(has_bias, num_tokens):
    torch.manual_seed(5)
    linear = torch.nn.Linear(1024, 3072, bias=has_bias, device="cuda", dtype=torch.bfloat16)
    fp8 = Fp8Linear(linear)
    x = rows_with_outliers(num_tokens, 1024, seed=num_tokens)
    with torch.inference_mode():
        rows = quantize_rows(x)
        got = fp8.mm(rows)
        want = dequantize(rows) @ (fp8.weight.float() * fp8.weight_scale.t()).t()
        if has_bias:
            want += linear.bias.float()
    assert got.dtype == torch.bfloat16 and got.shape == (num_tokens, 3072)
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2 * float(want.abs().max()))


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="module")
def minilm():
    """(directory, token ids of the e2e corpus' 240 texts, their float32 transformers rows)."""
    path = real_minilm_dir()
    assert path is not None, CARRY_HINT
    seqs = tokenized_corpus(path)
    return path, seqs, float32_rows(path, seqs, "cuda")


def run_batches(engine, seqs: list[np.ndarray], size: int) -> np.ndarray:
    out = []
    for i in range(0, len(seqs), size):
        batch = seqs[i : i + size]
        lengths = np.array([len(s) for s in batch], np.int32)
        out.append(engine.step(engine.pack(np.concatenate(batch), lengths)).wait())
    return np.concatenate(out)


def test_fp8_engine_on_the_real_minilm_against_float32_transformers(minilm):
    path, seqs, reference = minilm
    engine = load_engine(WorkerConfig(model=path, device="cuda", dtype="bfloat16", linear_dtype="fp8"))
    assert isinstance(engine, CudaEngine) and engine.info.dtype == "bfloat16+fp8"
    passes = {}  # no prewarm: a bucket runs eagerly on its first hit, is captured on its second
    for name in ("first", "second", "third"):
        passes[name] = run_batches(engine, seqs, 16)
    assert engine.graphs.num_replays > 0 and engine.graphs.num_resident > 0
    bf16 = run_batches(
        load_engine(WorkerConfig(model=path, device="cuda", dtype="bfloat16", cuda_graphs=False)), seqs, 16
    )
    print(f"\nreal MiniLM, {len(seqs)} texts, cosine against transformers float32:")
    for name, rows in {"bf16": bf16, **{f"fp8 {k}": v for k, v in passes.items()}}.items():
        cos = cosine_rows(rows, reference)
        print(f"  {name:<11} min {cos.min():.5f} mean {cos.mean():.5f}")
        assert cos.min() >= 0.98, (name, cos.min())
    assert cosine_rows(passes["third"], passes["first"]).min() >= 0.999  # replayed against eager


async def test_fp8_interactive_lane_beside_bulk_matches_float32_transformers(minilm):
    """The lane's graphs and the main path's run at once over the same fp8 weights: each
    call's quantised activations are its own, so both sides' rows stay right."""
    path, seqs, reference = minilm
    engine = load_engine(
        WorkerConfig(model=path, device="cuda", dtype="bfloat16", linear_dtype="fp8", max_batch_tokens=1024)
    )
    assert isinstance(engine, CudaEngine) and engine.lane is not None
    engine.prewarm_at_start("all", (), 300)
    scheduler = Scheduler(
        engine, max_batch_tokens=1024, max_queued_tokens=1 << 20, lane=engine.lane, lane_max_batch_tokens=256
    )
    scheduler.start()
    order = np.argsort([len(s) for s in seqs])
    short, rest = [int(i) for i in order[:80]], [int(i) for i in order[80:]]
    bulk = [rest[i : i + 16] for i in range(0, len(rest), 16)]
    try:
        bulk_calls = [
            asyncio.ensure_future(
                scheduler.submit(
                    np.concatenate([seqs[i] for i in group]),
                    np.array([len(seqs[i]) for i in group], np.int32),
                    priority=Priority.BULK,
                )
            )
            for group in bulk
        ]
        await asyncio.sleep(0)
        query_calls = []
        for i in short:
            query_calls.append(
                asyncio.ensure_future(
                    scheduler.submit(
                        seqs[i], np.array([len(seqs[i])], np.int32), priority=Priority.INTERACTIVE
                    )
                )
            )
            await asyncio.sleep(0.001)
        results = await asyncio.gather(*bulk_calls, *query_calls)
    finally:
        await scheduler.close()
    assert scheduler.num_lane_batches > 0, "no query took the lane while bulk ran"
    rows = np.concatenate(results)
    cos = cosine_rows(rows, reference[[i for group in bulk for i in group] + short])
    print(f"\nfp8, lane beside bulk: min {cos.min():.5f} mean {cos.mean():.5f}")
    assert cos.min() >= 0.98


def write_random_model(name: str, path: Path, num_layers: int, vocab_size: int) -> None:
    """The benchmark model `name` (tests/bench/configs) with fewer layers and a smaller vocabulary,
    random bf16 weights, as a model directory at `path`."""
    shutil.copytree(CONFIGS / name, path)
    config = json.loads((path / "config.json").read_text())
    config.update(num_hidden_layers=num_layers, vocab_size=vocab_size)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):  # none past the smaller vocabulary
        if isinstance(config.get(key), int) and config[key] >= vocab_size:
            config[key] = None
    (path / "config.json").write_text(json.dumps(config))
    torch.manual_seed(0)
    hf_config = transformers.AutoConfig.from_pretrained(path)
    transformers.AutoModel.from_config(hf_config, dtype=torch.bfloat16).save_pretrained(path)


@pytest.mark.parametrize("name", ["bge-m3", "qwen3-0.6b"])
def test_fp8_engine_matches_its_bf16_engine_on_a_random_model_shape(name, tmp_path):
    """The benchmark models' widths (4 layers, a small vocabulary, random weights): the fp8 engine
    runs, captured and replayed, within cosine 0.98 of the same model in bf16."""
    write_random_model(name, tmp_path / "model", num_layers=4, vocab_size=8192)
    rng = np.random.default_rng(1)
    seqs = [rng.integers(5, 8192, int(n)).astype(np.int32) for n in rng.integers(8, 500, 24)]
    base = WorkerConfig(model=tmp_path / "model", device="cuda", dtype="bfloat16", max_batch_tokens=8192)
    want = run_batches(load_engine(base), seqs, 8)
    engine = load_engine(dataclasses.replace(base, linear_dtype="fp8"))
    for _ in range(3):  # eager, captured, replayed
        got = run_batches(engine, seqs, 8)
        cos = cosine_rows(got, want)
        print(f"\n{name} shape, fp8 vs bf16: min {cos.min():.5f} mean {cos.mean():.5f}")
        assert np.isfinite(got).all() and cos.min() >= 0.98
    assert engine.graphs.num_replays > 0
