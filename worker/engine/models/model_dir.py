"""Reading a local Hugging Face-format model directory: config, sentence-transformers pipeline, weights.

Pooling, Dense layers and normalisation follow the directory's sentence-transformers files
(`modules.json`, each module's `config.json`) exactly as `SentenceTransformer(dir)` would build its
pipeline; a module kembed does not apply refuses the directory, naming it, rather than serve
vectors that differ from sentence-transformers'. Nothing here downloads anything.
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from kembed.worker.engine.models.dense import DenseSpec, read_dense
from kembed.worker.engine.models.logit_score import LogitScoreSpec, read_logit_score
from kembed.worker.engine.models.splade import SpladeSpec, read_splade
from kembed.worker.errors import InvalidInput

# Prefixes under which task heads (BertForSequenceClassification, ...) store the encoder.
_ENCODER_PREFIXES = ("bert.", "roberta.", "model.", "mpnet.", "deberta.")
# sentence-transformers pooling flags, in the order it checks them, mapped to our pooling names.
_POOLING_MODES = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_lasttoken": "last",
}


@dataclass(frozen=True)
class ModelDir:
    """A parsed model directory: what to build and how to pool, not yet the weights."""

    path: Path
    config: dict[str, Any]  # config.json as written
    pooling: str | None  # "cls" | "mean" | "last"; None: no sentence-transformers pipeline, family default
    normalize: bool  # the pipeline ends in sentence_transformers.models.Normalize
    dense: tuple[DenseSpec, ...] = ()  # Dense modules after pooling, in order (applied by the model)
    splade: SpladeSpec | None = None  # a SparseEncoder's SpladePooling (splade.py); None: not one
    adapter: str = ""  # the deployment's task adapter (WorkerConfig.adapter); "": the base weights
    logit_score: LogitScoreSpec | None = None  # an LLM reranker's LogitScore (logit_score.py); None: not one

    @property
    def model_type(self) -> str:
        return str(self.config.get("model_type", ""))


def read_model_dir(path: Path) -> ModelDir:
    """Parse config.json and the sentence-transformers pipeline of `path`."""
    path = Path(path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise InvalidInput(f"{path} is not a model directory: config.json is missing")
    config = json.loads(config_file.read_text())
    splade = _read_splade_pipeline(path)
    if splade is not None:
        return ModelDir(path=path, config=config, pooling=None, normalize=False, splade=splade)
    logit_score = _read_logit_score_pipeline(path)
    if logit_score is not None:
        return ModelDir(path=path, config=config, pooling=None, normalize=False, logit_score=logit_score)
    pooling, dense, normalize = _read_pipeline(path)
    return ModelDir(path=path, config=config, pooling=pooling, normalize=normalize, dense=dense)


def _read_splade_pipeline(path: Path) -> SpladeSpec | None:
    """A sentence-transformers SparseEncoder's pipeline, a masked-LM transformer then SpladePooling
    (and nothing else), as its SpladeSpec; None for any other directory. The transformer is an
    `MLMTransformer` (sentence-transformers 5) or a `Transformer` whose sentence_bert_config.json says
    `"transformer_task": "fill-mask"` (what 6 writes, `SparseEncoder(dir)` of a masked LM included)."""
    modules_file = path / "modules.json"
    if not modules_file.is_file():
        return None
    modules = json.loads(modules_file.read_text())
    names = [str(module.get("type", "")).rsplit(".", 1)[-1] for module in modules]
    if "SpladePooling" not in names and "MLMTransformer" not in names:
        return None
    if len(names) != 2 or names[1] != "SpladePooling" or not _is_masked_lm(path, names[0], modules[0]):
        raise InvalidInput(
            f"{modules_file}: a sparse encoder's pipeline is served as a masked-LM transformer "
            "(MLMTransformer, or Transformer with transformer_task fill-mask) then SpladePooling, "
            f"not {', '.join(_described(path, names, modules))}"
        )
    return read_splade(path / modules[1].get("path", ""))


def _read_logit_score_pipeline(path: Path) -> LogitScoreSpec | None:
    """A CrossEncoder's pipeline on a causal LM, a Transformer of task text-generation then
    LogitScore (and nothing else), as its LogitScoreSpec; None for any other directory."""
    modules_file = path / "modules.json"
    if not modules_file.is_file():
        return None
    modules = json.loads(modules_file.read_text())
    names = [str(module.get("type", "")).rsplit(".", 1)[-1] for module in modules]
    if "LogitScore" not in names:
        return None
    is_causal_lm = names[0] == "Transformer" and _transformer_task(path, modules[0]) == "text-generation"
    if len(names) != 2 or names[1] != "LogitScore" or not is_causal_lm:
        raise InvalidInput(
            f"{modules_file}: an LLM reranker's pipeline is served as a Transformer with transformer_task "
            f"text-generation then LogitScore, not {', '.join(_described(path, names, modules))}"
        )
    return read_logit_score(path / modules[1].get("path", ""))


def _transformer_task(path: Path, module: dict[str, Any]) -> str | None:
    """A Transformer module's `transformer_task` (its sentence_bert_config.json); None if unset."""
    file = path / str(module.get("path", "")) / "sentence_bert_config.json"
    config = json.loads(file.read_text()) if file.is_file() else {}
    task = config.get("transformer_task")
    return None if task is None else str(task)


def _is_masked_lm(path: Path, name: str, module: dict[str, Any]) -> bool:
    return name == "MLMTransformer" or (
        name == "Transformer" and _transformer_task(path, module) == "fill-mask"
    )


def _described(path: Path, names: list[str], modules: list[dict[str, Any]]) -> list[str]:
    """Module names, a Transformer's with its task (`Transformer (feature-extraction)`)."""
    return [
        f"{name} ({_transformer_task(path, module) or 'no transformer_task'})"
        if name == "Transformer"
        else name
        for name, module in zip(names, modules, strict=True)
    ]


def _read_pipeline(path: Path) -> tuple[str | None, tuple[DenseSpec, ...], bool]:
    """(pooling, Dense modules, normalize) from modules.json; a bare transformers directory: the
    family's default pooling (None), no normalise. The pipeline must read Transformer, Pooling, any
    Dense modules, [Normalize]: InvalidInput names a module that is not one of them or out of order
    (a Dense module before pooling works on token vectors; after Normalize, on normalised ones)."""
    modules_file = path / "modules.json"
    if not modules_file.is_file():
        return None, (), False
    modules = json.loads(modules_file.read_text())
    pooling = "mean"
    dense: list[DenseSpec] = []
    normalize = False
    stage = 0  # 0: before Pooling, 1: after it, 2: after Normalize
    for module in modules:
        kind = str(module.get("type", ""))
        name = kind.rsplit(".", 1)[-1]
        where = path / module.get("path", "")
        if name == "Transformer" and stage == 0:
            continue
        if name == "Pooling" and stage == 0:
            pooling, stage = _read_pooling(where), 1
        elif name == "Dense" and stage == 1:
            dense.append(read_dense(where))
        elif name == "Normalize" and stage == 1:
            normalize, stage = True, 2
        else:
            raise InvalidInput(
                f"{modules_file}: module {module.get('name', '?')} ({kind}) is not one kembed applies "
                "where it stands: it serves Transformer, Pooling, Dense modules and Normalize, in that "
                "order, and refuses anything else rather than serve vectors sentence-transformers would not"
            )
    return pooling, tuple(dense), normalize


def _read_pooling(pooling_dir: Path) -> str:
    config = json.loads((pooling_dir / "config.json").read_text())
    if "pooling_mode" in config:  # newer sentence-transformers write the mode by name
        mode: str = {"lasttoken": "last"}.get(config["pooling_mode"], config["pooling_mode"])
        if mode in _POOLING_MODES.values():
            return mode
    for flag, mode in _POOLING_MODES.items():
        if config.get(flag):
            return mode
    enabled = [key for key, value in config.items() if key.startswith("pooling_mode") and value]
    raise InvalidInput(f"unsupported pooling in {pooling_dir}: {enabled or 'none enabled'}")


def load_weights(path: Path) -> dict[str, torch.Tensor]:
    """All safetensors shards of the directory, keys stripped of task-head prefixes."""
    weights: dict[str, torch.Tensor] = {}
    for file in weight_files(path):
        for key, tensor in load_file(file).items():
            weights[_strip_prefix(key)] = tensor
    return weights


def weight_files(path: Path) -> list[Path]:
    """The directory's safetensors shards; InvalidInput if it has none (pickled `*.bin` weights
    are never loaded: unpickling runs whatever code the file holds)."""
    # BGE-M3's heads (heads.py) sit beside the encoder's weights and load apart
    heads = {"sparse_linear.safetensors", "colbert_linear.safetensors"}
    files = sorted(p for p in Path(path).glob("*.safetensors") if p.name not in heads)
    if files:
        return files
    pickled = sorted(p.name for p in Path(path).glob("*.bin"))
    if pickled:
        raise InvalidInput(
            f"no *.safetensors weights in {path}, only pickled ones ({', '.join(pickled)}), which kembed "
            "does not load: convert them to safetensors (docs/your-model.md)"
        )
    raise InvalidInput(f"no *.safetensors weights in {path}")


def _strip_prefix(key: str) -> str:
    for prefix in _ENCODER_PREFIXES:
        if key.startswith(prefix):
            return key[len(prefix) :]
    return key
