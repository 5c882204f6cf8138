"""GPU: what serving a SPLADE model costs. `python3 -P tests/bench/bench_splade.py`.

A SPLADE model of naver/splade-cocondenser-ensembledistil's shape (tests/bench/configs/splade-bert-base:
BERT-base with its masked-LM head, 30,522 words; random bf16 weights, the decoder's bias lowered so
that a 128-token row has `--nonzero` nonzero weights, as a trained model's passages have a few
hundred; shorter rows have fewer, longer more) on the CUDA
engine with graphs, against:
- the strongest baseline a user would build: transformers' BertForMaskedLM with the same weights,
  log(1 + ReLU) max-pooled, the whole forward in one CUDA graph at the batch's padded shape, its rows
  copied to pinned host memory;
- kembed's dense step of the same encoder (CLS pooling, same weights): what the masked-LM head and
  the vocabulary-wide rows cost over a dense embedding.
The three take turns step by step (rotating order); per round each one's median of `--iters` steps.
Also the worker's host work per batch that a dense model does not have: packing the rows into their
nonzero (id, weight) pairs (kembed.proto.outputs.vocabulary_words), which runs on the worker's event
loop. Prints markdown: median of the rounds (worst round).
"""

import argparse
import functools
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from kembed.proto.outputs import vocabulary_words
from kembed.worker.config import WorkerConfig
from kembed.worker.engine import load_engine

CONFIG = Path(__file__).resolve().parent / "configs" / "splade-bert-base" / "config.json"


def write_model(path: Path, nonzero: int) -> tuple[Path, Path, float]:
    """(SPLADE directory, dense CLS directory, the decoder's bias) sharing one BertForMaskedLM
    checkpoint's weights; the bias leaves `nonzero` weights in the row of 128 random tokens."""
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig(**json.loads(CONFIG.read_text()))).eval()
    with torch.no_grad():
        ids = torch.randint(1000, 30000, (1, 128))
        pooled = model(input_ids=ids).logits.amax(1)[0]
        bias = -float(pooled.topk(nonzero + 1).values[-1])
        model.cls.predictions.bias.fill_(bias)
    model = model.to(torch.bfloat16)
    splade, dense = path / "splade", path / "dense"
    model.save_pretrained(splade)
    model.save_pretrained(dense)
    sparse_modules = "sentence_transformers.sparse_encoder.modules"
    (splade / "modules.json").write_text(
        json.dumps([
            {"idx": 0, "name": "0", "path": "", "type": f"{sparse_modules}.mlm_transformer.MLMTransformer"},
            {"idx": 1, "name": "1", "path": "1_SpladePooling",
             "type": f"{sparse_modules}.splade_pooling.SpladePooling"},
        ])
    )  # fmt: skip
    (splade / "1_SpladePooling").mkdir()
    (splade / "1_SpladePooling" / "config.json").write_text(
        json.dumps(
            {"pooling_strategy": "max", "activation_function": "relu", "word_embedding_dimension": 30522}
        )
    )
    (dense / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]))  # fmt: skip
    (dense / "1_Pooling").mkdir()
    (dense / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 768, "pooling_mode_cls_token": True})
    )
    return splade, dense, bias


class GraphedTransformers:
    """BertForMaskedLM + SPLADE max pooling in one CUDA graph at a padded [batch, max length] shape."""

    def __init__(self, path: Path, lengths: np.ndarray) -> None:
        from transformers import BertForMaskedLM

        self.model = BertForMaskedLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()
        self.lengths = lengths
        shape = (len(lengths), int(lengths.max()))
        self.ids = torch.zeros(shape, dtype=torch.long, device="cuda")
        self.mask = torch.zeros(shape, dtype=torch.long, device="cuda")
        self.host_ids = torch.zeros(shape, dtype=torch.long, pin_memory=True)
        self.host_mask = torch.zeros(shape, dtype=torch.long, pin_memory=True)
        self.rows = torch.empty(
            (shape[0], self.model.config.vocab_size), dtype=torch.float32, pin_memory=True
        )
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.no_grad():
            for _ in range(3):
                self._forward()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph), torch.no_grad():
            self.out = self._forward()

    def _forward(self) -> torch.Tensor:
        logits = self.model(input_ids=self.ids, attention_mask=self.mask).logits
        weights = torch.log1p(torch.relu(logits)) * self.mask.unsqueeze(-1)
        return weights.amax(1).float()

    def step(self, ids: np.ndarray) -> np.ndarray:
        """One batch: pad on the host, copy in, replay, rows to the host."""
        self.host_ids.zero_()
        self.host_mask.zero_()
        at = 0
        for i, n in enumerate(self.lengths):
            self.host_ids[i, :n] = torch.from_numpy(ids[at : at + n])
            self.host_mask[i, :n] = 1
            at += n
        self.ids.copy_(self.host_ids, non_blocking=True)
        self.mask.copy_(self.host_mask, non_blocking=True)
        self.graph.replay()
        self.rows.copy_(self.out, non_blocking=True)
        torch.cuda.current_stream().synchronize()
        return self.rows.numpy()


def kembed_step(engine, ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    return engine.step(engine.pack(ids, lengths)).wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--nonzero", type=int, default=300)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        splade_dir, dense_dir, bias = write_model(Path(tmp), args.nonzero)
        engines = {
            name: load_engine(WorkerConfig(model=path, device="cuda", dtype="bfloat16", prewarm="none"))
            for name, path in (("splade", splade_dir), ("dense", dense_dir))
        }
        shapes = {
            "1 x 128": np.array([128]),
            "64 x 16": np.full(64, 16),
            "16 x 32-512": rng.integers(32, 513, 16),
        }
        baselines = {shape: GraphedTransformers(splade_dir, lengths) for shape, lengths in shapes.items()}
    print(
        f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"{args.rounds} rounds x {args.iters} steps, decoder bias {bias:.3f}"
    )
    print(
        "| shape | nonzero weights a row | transformers + CUDA graph (ms) | kembed SPLADE step (ms) "
        "| kembed dense step, same encoder (ms) | packing the rows, host (ms) |"
    )
    print("|---|---|---|---|---|---|")
    for shape, lengths in shapes.items():
        lengths = lengths.astype(np.int32)
        ids = rng.integers(1000, 30000, int(lengths.sum())).astype(np.int32)
        ids[np.cumsum(lengths) - lengths] = 101  # [CLS] first
        splade, dense, baseline = engines["splade"], engines["dense"], baselines[shape]

        steps = [
            functools.partial(baseline.step, ids),
            functools.partial(kembed_step, splade, ids, lengths),
            functools.partial(kembed_step, dense, ids, lengths),
        ]
        rows = kembed_step(splade, ids, lengths)
        want = baseline.step(ids)
        cosines = (rows * want).sum(1) / (np.linalg.norm(rows, axis=1) * np.linalg.norm(want, axis=1))
        for step in steps:
            for _ in range(3):  # eager, capture, replay
                step()
        samples: list[list[float]] = [[] for _ in steps]
        for _ in range(args.rounds):
            times: list[list[float]] = [[] for _ in steps]
            for i in range(args.iters):
                for k in range(len(steps)):
                    j = (i + k) % len(steps)
                    torch.cuda.synchronize()
                    started = time.perf_counter()
                    steps[j]()
                    times[j].append((time.perf_counter() - started) * 1e3)
            for j, t in enumerate(times):
                samples[j].append(statistics.median(t))
        packing = []
        for _ in range(args.iters):
            started = time.perf_counter()
            vocabulary_words(rows)
            packing.append((time.perf_counter() - started) * 1e3)
        nonzero = (rows > 0).sum(1)
        print(
            f"  ({shape}: rows against transformers' min cosine {cosines.min():.5f}; "
            f"nonzero weights a row {int(nonzero.min())}-{int(nonzero.max())})",
            flush=True,
        )
        cells = [f"{statistics.median(s):.3f} ({max(s):.3f})" for s in samples]
        print(
            f"| {shape} | {int(np.median(nonzero))} | {' | '.join(cells)} "
            f"| {statistics.median(packing):.3f} ({max(packing):.3f}) |",
            flush=True,
        )


if __name__ == "__main__":
    main()
