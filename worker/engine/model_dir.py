"""Reading a local Hugging Face-format model directory: config, sentence-transformers pipeline, weights.

Pooling and normalisation follow the directory's sentence-transformers files (`modules.json`, the
Pooling module's `config.json`) exactly as `SentenceTransformer(dir)` would build its pipeline.
Nothing here downloads anything.
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from kembed.worker.errors import InvalidInput

# Prefixes under which task heads (BertForSequenceClassification, ...) store the encoder.
_ENCODER_PREFIXES = ("bert.", "roberta.", "model.")
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
    pooling, normalize = _read_pipeline(path)
    return ModelDir(path=path, config=config, pooling=pooling, normalize=normalize)


def _read_pipeline(path: Path) -> tuple[str | None, bool]:
    """(pooling, normalize) from modules.json; a bare transformers directory: the family's
    default pooling (None), no normalise."""
    modules_file = path / "modules.json"
    if not modules_file.is_file():
        return None, False
    modules = json.loads(modules_file.read_text())
    pooling = "mean"
    normalize = False
    for module in modules:
        kind = str(module.get("type", ""))
        if kind.endswith("Pooling"):
            pooling = _read_pooling(path / module.get("path", ""))
        elif kind.endswith("Normalize"):
            normalize = True
    return pooling, normalize


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
    files = sorted(Path(path).glob("*.safetensors"))
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
