"""Model directories as sentence-transformers saves them, around a transformers model with random
weights and the bundled all-MiniLM-L6-v2 tokenizer, and what the engine and sentence-transformers
each make of the same texts: the reference of the family tests (ModernBERT, Gemma 3, Mistral)."""

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kembed.worker.config import WorkerConfig, bundled_model_dir
from kembed.worker.engine import load_engine

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
VOCAB_SIZE = 30522  # the bundled tokenizer's: [CLS] 101, [SEP] 102, [PAD] 0


def randomise_norms(model: torch.nn.Module, low: float, high: float) -> None:
    """Norm weights (and biases) start at one or zero: random ones show a misplaced norm."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(low, high)


def save_transformer(model: Any, path: Path) -> Path:
    """`model` saved by transformers (safetensors) with the bundled tokenizer's files beside it."""
    model.save_pretrained(path)
    for name in TOKENIZER_FILES:
        shutil.copy(bundled_model_dir() / name, path / name)
    return path


def save_sentence_transformer(
    hf_dir: Path, path: Path, pooling: str, after: list[Any], prompts: dict[str, str] | None = None
) -> Path:
    """Transformer(hf_dir) -> Pooling(`pooling`) -> `after` (Dense modules, Normalize), saved by
    sentence-transformers into `path` as it saves a hub model."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    transformer = Transformer(str(hf_dir), max_seq_length=256)
    pool = Pooling(transformer.get_embedding_dimension(), pooling_mode=pooling)
    model = SentenceTransformer(modules=[transformer, pool, *after], prompts=prompts, device="cpu")
    model.save(str(path))
    return path


def engine_rows(path: Path, ids: list[list[int]], batch: int, backend: str = "sdpa") -> np.ndarray:
    """The CPU engine's rows for token id lists, `batch` sequences a step (mixed lengths together)."""
    engine = load_engine(WorkerConfig(model=path, device="cpu", attention_backend=backend))
    rows = []
    for at in range(0, len(ids), batch):
        chunk = ids[at : at + batch]
        lengths = np.array([len(x) for x in chunk], np.int32)
        rows.append(engine.step(engine.pack(np.concatenate(chunk).astype(np.int32), lengths)).wait())
    return np.concatenate(rows)


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
