"""Which model a directory holds, as digests both ends compute the same way: the worker reports its
own in Info, the gateway computes them from its directory and refuses a replica that serves another
model than the one it tokenizes for (gateway/pool/model_check.py).

Two digests, because a gateway may hold only part of a directory (on Kubernetes a gateway pod
fetches all but the weights):
- **tokenizer**: what turns a text into ids: tokenizer.json's bytes and the tokenization settings read
  from the directory (`model_files.ModelSpec`: max_seq_length, lowercasing, truncation side,
  vocabulary size, the tokens a sparse output drops). A gateway always has these. Prompts are not in
  it: they are text the gateway prepends, and a gateway may carry prompts of its own.
- **model**: what turns ids into vectors: every weight file (relative path, size, content) and the
  configuration files that shape the answer (config.json, modules.json and each module folder's
  config.json: pooling, Dense, Normalize). Empty where the directory has no weight files.

A directory's name is in neither: the same model under two names is the same model. The deployment's
overrides (a gateway's `max_seq_length`, a worker's `pooling`) are not either: they are settings, and
the worker's effective pooling and normalisation travel in Info beside the digests.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import mmap
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from kembed.proto.model_files import ModelSpec

# Weight files as sentence-transformers, transformers and FlagEmbedding save them (BGE-M3's heads
# are .pt files). The golden check digests the same files (gateway/golden.py).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
# The configuration files that shape a vector given its ids, wherever they sit in the tree:
# config.json at the root and in each module folder (1_Pooling/, 2_Dense/), and modules.json.
CONFIG_NAMES = frozenset({"config.json", "modules.json"})
CHUNK_BYTES = 8 << 20
PREFIX = "sha256:"


@dataclass(frozen=True, slots=True)
class ModelIdentity:
    """A model directory's two digests (`sha256:<hex>`; `model` is "" without weight files)."""

    tokenizer: str
    model: str

    def short(self) -> str:
        """One line for logs: both digests cut to 12 hex digits."""
        return f"tokenizer {_short(self.tokenizer)}, model {_short(self.model) if self.model else 'unknown'}"


def _short(digest: str) -> str:
    return digest.removeprefix(PREFIX)[:12]


def _visible(path: Path, root: Path) -> bool:
    """Not under a hidden folder of the tree (`.cache/`, a fetch's staging marks): what a model is."""
    return not any(part.startswith(".") for part in path.relative_to(root).parts)


def weight_files(model_dir: Path) -> list[Path]:
    """Every weight file under `model_dir`, sorted by path."""
    found = (p for p in model_dir.rglob("*") if p.suffix in WEIGHT_SUFFIXES and p.is_file())
    return sorted(p for p in found if _visible(p, model_dir))


def file_sha256(path: Path) -> str:
    """The file's sha256, read through a mapping: no buffer is allocated. (Reading it in 8 MiB chunks
    raised glibc's mmap threshold to 8 MiB for the rest of the process, whose large allocations then
    stayed on a heap that trims badly: a gateway's RSS after large requests grew by half.)"""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        if os.fstat(file.fileno()).st_size == 0:
            return digest.hexdigest()
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            view = memoryview(mapped)
            try:  # hashlib releases the GIL on each slice: files hash in parallel
                for start in range(0, len(view), CHUNK_BYTES):
                    digest.update(view[start : start + CHUNK_BYTES])
            finally:
                view.release()
    return digest.hexdigest()


def files_digest(model_dir: Path, files: list[Path]) -> str:
    """`sha256:<hex>` over each file's path relative to `model_dir`, size and content, in order."""
    with ThreadPoolExecutor(max(1, min(4, len(files)))) as pool:
        contents = list(pool.map(file_sha256, files))
    outer = hashlib.sha256()
    for path, content in zip(files, contents, strict=True):
        outer.update(f"{path.relative_to(model_dir).as_posix()}\0{path.stat().st_size}\0{content}\n".encode())
    return PREFIX + outer.hexdigest()


def tokenizer_digest(spec: ModelSpec) -> str:
    """`sha256:<hex>` over tokenizer.json's bytes and the directory's tokenization settings (`spec` as
    read by `load_model_spec`, before a deployment's overrides)."""
    facts = dataclasses.asdict(spec)
    # Not how a text becomes ids: where the files are and what it is called, a reranker's label names,
    # and the prompts, which are the gateway's to prepend (a gateway may carry its own: `--prompts`).
    for name in ("name", "tokenizer_file", "id2label", "prompts", "default_prompt_name"):
        facts.pop(name)
    facts["tokenizer.json"] = file_sha256(spec.tokenizer_file)
    return PREFIX + hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()


def model_digest(model_dir: Path) -> str:
    """`sha256:<hex>` over the weight files and the configuration files that shape the answer; ""
    when `model_dir` holds no weight file (a gateway's directory without them)."""
    weights = weight_files(model_dir)
    if not weights:
        return ""
    configs = [
        p for p in model_dir.rglob("*") if p.name in CONFIG_NAMES and p.is_file() and _visible(p, model_dir)
    ]
    return files_digest(model_dir, sorted(set(weights) | set(configs)))


def read_identity(model_dir: Path, spec: ModelSpec | None) -> ModelIdentity:
    """`model_dir`'s identity; `spec` its tokenizer settings (None: it has no tokenizer.json, and its
    tokenizer digest is "")."""
    return ModelIdentity(tokenizer_digest(spec) if spec is not None else "", model_digest(model_dir))
