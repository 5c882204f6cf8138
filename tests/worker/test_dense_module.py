"""A sentence-transformers `Dense` module after pooling is applied as sentence-transformers applies it:
the bundled all-MiniLM-L6-v2 with Dense modules of random weights, saved by sentence-transformers
itself (safetensors, or a pickled `pytorch_model.bin` read as tensors only), served by the worker's
engine within cosine 0.999 of `SentenceTransformer(dir).encode` for every row, the Dense module's
output size reported as the served dimensions. A pipeline kembed cannot apply is refused at load,
naming the module. On a GPU the layers run inside the captured CUDA graph (the `gpu` test)."""

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from real_minilm import CARRY_HINT, corpus_texts, real_minilm_dir, tokenized_corpus
from safetensors.torch import save_file

from kembed.worker.config import WorkerConfig
from kembed.worker.engine import load_engine
from kembed.worker.errors import InvalidInput
from kembed.worker.tools.check_model import check

TEXTS = corpus_texts(32)
Dense = Any  # sentence_transformers' Dense module, imported where the tests need it


def _sentence_transformers() -> Any:
    return pytest.importorskip("sentence_transformers")


@pytest.fixture(scope="module")
def bundled():
    path = real_minilm_dir()
    if path is None:
        pytest.skip(CARRY_HINT)
    return path, _sentence_transformers().SentenceTransformer(str(path), device="cpu")


def with_dense(bundled, path: Path, layers: list[Dense]) -> Path:
    """The bundled pipeline with `layers` between Pooling and Normalize in `path`: its files linked,
    each Dense module saved by sentence-transformers into a folder of its own, modules.json listing
    them as sentence-transformers lists its modules."""
    source, _ = bundled
    path.mkdir()
    for entry in source.iterdir():
        if entry.name != "modules.json":
            (path / entry.name).symlink_to(entry)
    modules = json.loads((source / "modules.json").read_text())
    entries = []
    for k, dense in enumerate(layers):
        folder = f"{k + 2}_Dense"
        (path / folder).mkdir()
        dense.save(str(path / folder))
        kind = f"{type(dense).__module__}.{type(dense).__name__}"
        entries.append({"idx": k + 2, "name": str(k + 2), "path": folder, "type": kind})
    normalize = {**modules[2], "idx": len(layers) + 2, "name": str(len(layers) + 2)}
    (path / "modules.json").write_text(json.dumps([*modules[:2], *entries, normalize]))
    return path


def random_dense(seed: int, in_features: int, out_features: int, **kwargs) -> Dense:
    from sentence_transformers.base.modules import Dense as StDense

    torch.manual_seed(seed)
    dense = StDense(in_features, out_features, **kwargs)
    with torch.no_grad():  # larger than the default init, so that the activation is not near linear
        dense.linear.weight.mul_(4.0)
    return dense


def served_rows(path: Path, texts: list[str], tokenizer) -> tuple[np.ndarray, int]:
    """The engine's rows for `texts`, tokenized as sentence-transformers tokenizes them, and the
    dimensions its Info reports."""
    engine = load_engine(WorkerConfig(model=path, device="cpu"))
    encoded = tokenizer(texts, truncation=True, max_length=256)["input_ids"]
    rows = []
    for at in range(0, len(encoded), 8):  # batches of 8 texts
        batch = encoded[at : at + 8]
        ids = np.concatenate([np.array(e, np.int32) for e in batch])
        lengths = np.array([len(e) for e in batch], np.int32)
        rows.append(engine.step(engine.pack(ids, lengths)).wait())
    return np.concatenate(rows), engine.info.dimensions


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.mark.parametrize(
    "layers",
    [
        lambda: [random_dense(0, 384, 128)],  # Dense's default: Tanh, with bias
        lambda: [
            random_dense(1, 384, 256, bias=False, activation_function=torch.nn.GELU()),
            random_dense(2, 256, 64, activation_function=torch.nn.Identity(), use_residual=True),
        ],
    ],
    ids=["tanh-384-to-128", "gelu-no-bias-then-identity-residual-to-64"],
)
def test_dense_modules_are_applied_as_sentence_transformers_applies_them(bundled, tmp_path, layers):
    built = layers()
    path = with_dense(bundled, tmp_path / "model", built)
    reference = _sentence_transformers().SentenceTransformer(str(path), device="cpu").encode(TEXTS)
    rows, dimensions = served_rows(path, TEXTS, bundled[1].tokenizer)
    assert dimensions == built[-1].out_features == reference.shape[1]
    assert cosines(rows, reference).min() >= 0.999
    assert bundled[1].get_embedding_dimension() == 384 != dimensions  # the pipeline without them


def test_a_dense_module_saved_as_pytorch_model_bin_is_read_as_tensors(bundled, tmp_path):
    path = with_dense(bundled, tmp_path / "model", [random_dense(3, 384, 96)])
    dense_dir = path / "2_Dense"
    (dense_dir / "model.safetensors").unlink()
    random_dense(3, 384, 96).save(str(dense_dir), safe_serialization=False)  # pytorch_model.bin
    assert not (dense_dir / "model.safetensors").exists()
    reference = _sentence_transformers().SentenceTransformer(str(path), device="cpu").encode(TEXTS[:8])
    rows, dimensions = served_rows(path, TEXTS[:8], bundled[1].tokenizer)
    assert dimensions == 96 and cosines(rows, reference).min() >= 0.999


def test_check_model_reports_the_dense_module_and_its_dimensions(bundled, tmp_path):
    path = with_dense(bundled, tmp_path / "model", [random_dense(4, 384, 128)])
    result = check(path)
    assert result.is_servable, result.reason
    assert result.dimensions == 128 and result.dense == ["2_Dense: 384 -> 128, Tanh"]


def _edit_dense(path: Path, **config) -> None:
    config_file = path / "2_Dense" / "config.json"
    config_file.write_text(json.dumps(json.loads(config_file.read_text()) | config))


DENSE_TYPE = "sentence_transformers.base.modules.dense.Dense"
LAYER_NORM = "sentence_transformers.sentence_transformer.modules.layer_norm.LayerNorm"
REFUSED = {
    "softplus": (
        lambda p: _edit_dense(p, activation_function="torch.nn.modules.activation.Softplus"),
        "activation torch.nn.modules.activation.Softplus, which kembed does not apply",
    ),
    "custom-activation": (
        lambda p: _edit_dense(p, activation_function="my_package.MyActivation"),
        "activation my_package.MyActivation, which kembed does not apply",
    ),
    "wrong-in-features": (lambda p: _edit_dense(p, in_features=512), "takes vectors of 512, but is fed 384"),
    "no-weights": (
        lambda p: (p / "2_Dense" / "model.safetensors").unlink(),
        "no model.safetensors or pytorch_model.bin",
    ),
    "token-output": (
        lambda p: _edit_dense(p, module_output_name="token_embeddings"),
        "module_output_name 'token_embeddings'",
    ),
    "dense-before-pooling": (lambda p: _reorder(p, [0, 2, 1, 3]), f"module 2 ({DENSE_TYPE}) is not"),
    "dense-after-normalize": (lambda p: _reorder(p, [0, 1, 3, 2]), f"module 2 ({DENSE_TYPE}) is not"),
    "unknown-module": (lambda p: _add_module(p, LAYER_NORM), f"({LAYER_NORM}) is not one kembed applies"),
}


@pytest.mark.parametrize(("edit", "message"), REFUSED.values(), ids=REFUSED.keys())
def test_a_pipeline_kembed_cannot_apply_is_refused_at_load_naming_the_module(
    bundled, tmp_path, edit, message
):
    path = with_dense(bundled, tmp_path / "model", [random_dense(5, 384, 128)])
    edit(path)
    with pytest.raises(InvalidInput) as refused:
        load_engine(WorkerConfig(model=path, device="cpu"))
    assert message in str(refused.value)


def _reorder(path: Path, order: list[int]) -> None:
    modules_file = path / "modules.json"
    modules = json.loads(modules_file.read_text())
    modules_file.write_text(json.dumps([modules[i] for i in order]))


def _add_module(path: Path, kind: str) -> None:
    modules_file = path / "modules.json"
    modules = json.loads(modules_file.read_text())
    modules.insert(3, {"idx": 9, "name": "9", "path": "9_Extra", "type": kind})
    modules_file.write_text(json.dumps(modules))
    shutil.copytree(path / "2_Dense", path / "9_Extra")


@pytest.mark.gpu
def test_dense_modules_run_inside_the_captured_cuda_graph(tmp_path):
    """A Dense module written by hand (config.json, model.safetensors), served by the CUDA engine in
    bfloat16: its first hit eager, its second captured, its third replayed, each within cosine 0.999
    of the CPU engine in float32 on the same directory."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    source = real_minilm_dir()
    if source is None:
        pytest.skip(CARRY_HINT)
    path = tmp_path / "model"
    path.mkdir()
    for entry in source.iterdir():
        if entry.name != "modules.json":
            (path / entry.name).symlink_to(entry.resolve())
    (path / "2_Dense").mkdir()
    config = {"in_features": 384, "out_features": 128, "bias": True,
              "activation_function": "torch.nn.modules.activation.Tanh"}  # fmt: skip
    (path / "2_Dense" / "config.json").write_text(json.dumps(config))
    generator = torch.Generator().manual_seed(6)
    weights = {"linear.weight": torch.randn(128, 384, generator=generator) * 0.2,
               "linear.bias": torch.randn(128, generator=generator) * 0.1}  # fmt: skip
    save_file(weights, str(path / "2_Dense" / "model.safetensors"))
    modules = json.loads((source / "modules.json").read_text())
    dense = {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}
    (path / "modules.json").write_text(json.dumps([*modules[:2], dense, {**modules[2], "idx": 3}]))
    from kembed.worker.engine.cuda_engine import CudaEngine

    seqs = tokenized_corpus(path, 16)
    ids, lengths = np.concatenate(seqs), np.array([len(s) for s in seqs], np.int32)
    cpu = load_engine(WorkerConfig(model=path, device="cpu"))
    reference = cpu.step(cpu.pack(ids, lengths)).wait()
    gpu = load_engine(WorkerConfig(model=path, device="cuda", dtype="bfloat16"))
    assert isinstance(gpu, CudaEngine) and gpu.info.dimensions == 128
    bucket = gpu.pack(ids, lengths).bucket
    for hit in range(3):
        rows = gpu.step(gpu.pack(ids, lengths)).wait()
        assert cosines(rows, reference).min() >= 0.999, hit
    assert gpu.graphs.is_captured(bucket) and gpu.graphs.num_replays >= 1
