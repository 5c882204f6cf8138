"""`python -m kembed.gateway.golden`: what a candidate revision answers for fixed texts, to compare
with what earlier revisions of the same weights answered (the operator's golden-embedding gate).

Run by the operator's rollout Job from the gateway image, beside the smoke test, with the gateway's
own settings (`--max-seq-length`, `--prompts`: what the revision's gateway is given): it reads the
model directory as the gateway does, tokenizes GOLDEN_TEXTS with the gateway's own tokenizer (a
tokenizer that no longer matches the weights changes the answer), embeds them on every candidate pod
over gRPC (or scores GOLDEN_PAIRS for a cross-encoder), as the gateway answers a request without a
prompt name, and PROMPTED_TEXTS under each of the model's prompts; it normalises the rows as the
gateway does (the pods' Info says whether: their pooling and normalisation are the workers' own),
so a record's norms are what clients got. It checks that the pods agree with each other and answer
finite values, and prints one `kembed-golden-record: {json}` line: the weights' digest and the
first pod's answer. The operator reads that line from the Job's log, compares it with the record
kept for the same weights (if any: directions and norms, golden.py there) and keeps the record of
weights it has not seen once the gate passes.

The weights' digest is the SHA-256 over the weight files (safetensors and the like, every module's),
their paths and sizes, not over the tokenizer or config files: "the same weights" under another
tokenizer, pooling or engine must still answer as before; new weights record their own answer.

Exit status: 0 the record is printed, 1 the pods disagree or answer NaN/Inf, 2 the model directory
or a worker is unusable.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import grpc
import numpy as np

from kembed.gateway.config import GatewayConfig, with_overrides
from kembed.gateway.pool.model_check import ModelCheck
from kembed.gateway.tokenizing.tokenization import Tokenization
from kembed.gateway.vectors import finish
from kembed.proto import embedder_pb2 as pb
from kembed.proto import embedder_pb2_grpc as pb_grpc
from kembed.proto.accuracy import MIN_COSINE
from kembed.proto.model_files import load_model_spec
from kembed.proto.model_identity import WEIGHT_SUFFIXES, files_digest, read_identity, weight_files

RECORD_PREFIX = "kembed-golden-record: "
# 2: rows as the gateway answers them (normalised where it normalises), `prompted` rows, `normalized`.
# A record of version 1 holds raw pooled rows: its directions are compared, not its norms.
RECORD_VERSION = 2
# Fixed forever: a record names the texts' digest, and a record made from other texts cannot be
# compared (the operator records anew, with a warning). Short and long, several scripts, code and
# numbers: the cases where a wrong tokenizer, pooling or kernel shows.
GOLDEN_TEXTS = (
    "what is the capital of france?",
    "Paris is the capital and most populous city of France. With an estimated population of "
    "2,102,650 residents in January 2023 in an area of more than 105 km2, Paris is the fourth-most "
    "populous city in the European Union and the 30th most densely populated city in the world.",
    "Wie funktioniert eine Wärmepumpe im Winter bei minus zehn Grad?",
    "向量数据库通过近似最近邻搜索在毫秒内找到相似的文本。",
    "東京の天気は明日晴れるでしょうか？",
    "def cosine(a, b):\n    return a @ b / (np.linalg.norm(a) * np.linalg.norm(b))",
    "🚀 launch at 09:30 UTC — see https://example.com/docs?id=42&lang=en",
    "A",
)
GOLDEN_PAIRS = tuple((GOLDEN_TEXTS[0], text) for text in GOLDEN_TEXTS[1:])
# Embedded once under each prompt of the model (a changed prefix shows on any text; a short and a
# long one keep the record small for models of a dozen prompts).
PROMPTED_TEXTS = GOLDEN_TEXTS[:2]


def texts_digest(texts: Sequence[str]) -> str:
    return hashlib.sha256(json.dumps(list(texts), ensure_ascii=False).encode()).hexdigest()


def weights_digest(model_dir: Path) -> str:
    """`sha256:<hex>` over every weight file's relative path, size and content (configs aside: the
    same weights under another pooling must answer as before)."""
    files = weight_files(model_dir)
    if not files:
        raise FileNotFoundError(f"no weight files ({', '.join(WEIGHT_SUFFIXES)}) in {model_dir}")
    return files_digest(model_dir, files)


def _batch(ids: list[np.ndarray], type_ids: list[np.ndarray] | None = None) -> pb.TokenBatch:
    batch = pb.TokenBatch(
        token_ids=np.concatenate(ids).astype("<i4").tobytes(), lengths=[len(row) for row in ids]
    )
    if type_ids is not None:
        batch.token_type_ids = np.concatenate(type_ids).astype("<i4").tobytes()
    return batch


def answer(
    stub: pb_grpc.EmbedderStub,
    task: str,
    batch: pb.TokenBatch,
    timeout_s: float,
    metadata: Sequence[tuple[str, str]],
) -> np.ndarray:
    """The pod's rows: embeddings [texts, dimensions] or logits [pairs, labels], float32."""
    if task == "score":
        scored = stub.Score(
            pb.ScoreRequest(batch=batch, request_id="golden"), timeout=timeout_s, metadata=metadata
        )
        return np.frombuffer(scored.scores, "<f4").reshape(scored.num_sequences, scored.num_labels)
    embedded = stub.Embed(
        pb.EmbedRequest(batch=batch, request_id="golden"), timeout=timeout_s, metadata=metadata
    )
    return np.frombuffer(embedded.embeddings, "<f4").reshape(embedded.num_sequences, embedded.dimensions)


def agreement(task: str, got: np.ndarray, reference: np.ndarray) -> float:
    """Embeddings: the least cosine per row. Logits: 1 - the largest absolute difference over (1 + |x|)."""
    if task == "score":
        return float(1.0 - (np.abs(got - reference) / (1.0 + np.abs(reference))).max())
    norms = np.linalg.norm(got, axis=1) * np.linalg.norm(reference, axis=1)
    return float(np.nan_to_num((got * reference).sum(1) / np.maximum(norms, 1e-30), nan=-1.0).min())


def encode_row(row: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(row, dtype="<f4").tobytes()).decode()


def run(args: argparse.Namespace) -> int:
    spec = load_model_spec(args.model)
    digest = weights_digest(args.model)
    channels = [grpc.insecure_channel(address) for address in args.target]
    stubs = [pb_grpc.EmbedderStub(channel) for channel in channels]
    infos = [stub.Info(pb.InfoRequest(), timeout=args.timeout, metadata=args.metadata) for stub in stubs]
    info = infos[0]
    # The gateway's own check first: a pod that serves another model than the directory the gateway
    # tokenizes with, or than the other pods, fails here, before its answers are compared.
    check = ModelCheck(read_identity(args.model, spec), args.model)
    refusals = [
        (address, check.refusal(pod, infos[:1] if n else ()))
        for n, (address, pod) in enumerate(zip(args.target, infos, strict=True))
    ]
    for address, refusal in refusals:
        if refusal:
            print(f"FAIL golden {address}: {refusal}")
    if any(refusal for _, refusal in refusals):
        return 1
    tokenization = Tokenization(with_overrides(spec, args.gateway), num_threads=1)
    prompt_names: list[str] = []
    try:
        if info.task == "score":
            texts: Sequence[str] = [f"{q}\n{d}" for q, d in GOLDEN_PAIRS]
            ids, type_ids = asyncio.run(
                tokenization.encode_pairs(
                    GOLDEN_PAIRS[0][0], [d for _, d in GOLDEN_PAIRS], truncate=True, direction=None
                )
            )
            batch = _batch(ids, type_ids)
        else:
            texts = GOLDEN_TEXTS
            prompt_names = sorted(tokenization.spec.prompts)

            def encode(inputs: Sequence[str], prompt_name: str | None) -> list[np.ndarray]:
                return asyncio.run(
                    tokenization.encode(
                        list(inputs),
                        truncate=True,
                        direction=None,
                        prompt_name=prompt_name,
                        vocab_size=info.vocab_size,
                    )
                )

            encoded = encode(GOLDEN_TEXTS, None)  # as a request without a prompt name
            for name in prompt_names:
                encoded += encode(PROMPTED_TEXTS, name)
            batch = _batch(encoded)
    finally:
        tokenization.close()
    rows = [answer(stub, info.task, batch, args.timeout, args.metadata) for stub in stubs]
    if info.task != "score":  # what the gateway answers: normalised where the model is
        rows = [finish(got, dimensions=None, normalize=info.normalize) for got in rows]
    failed = False
    for address, got in zip(args.target, rows, strict=True):
        if not np.isfinite(got).all():
            print(f"FAIL golden {address}: NaN/Inf in the answer")
            failed = True
            continue
        if got.shape != rows[0].shape:
            print(f"FAIL golden {address}: shape {got.shape}, {args.target[0]} answered {rows[0].shape}")
            failed = True
            continue
        worst = agreement(info.task, got, rows[0])
        verdict = "ok  " if worst >= args.min_cosine else "FAIL"
        print(
            f"{verdict} golden {address}: {len(got)} rows, least agreement with {args.target[0]} {worst:.6f}"
        )
        failed |= worst < args.min_cosine
    if failed:
        return 1
    answered, prompted = rows[0][: len(texts)], rows[0][len(texts) :]
    record = {
        "version": RECORD_VERSION,
        "weights": digest,
        "task": info.task,
        "textsSha256": texts_digest(texts),
        "modelType": info.model_type,
        "rows": [encode_row(row) for row in answered],
        "columns": int(rows[0].shape[1]),
        "normalized": bool(info.normalize) and info.task != "score",
        "maxSeqLength": tokenization.spec.max_seq_length,
        "prompted": {
            name: [
                encode_row(row) for row in prompted[n * len(PROMPTED_TEXTS) : (n + 1) * len(PROMPTED_TEXTS)]
            ]
            for n, name in enumerate(prompt_names)
        },
    }
    print(f"weights {digest}, {len(args.target)} pod(s) agree")
    print(RECORD_PREFIX + json.dumps(record, separators=(",", ":")), flush=True)
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m kembed.gateway.golden", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--model", type=Path, required=True, help="the model directory, as the gateway's --model"
    )
    parser.add_argument(
        "--target", action="append", required=True, metavar="ADDR", help="worker host:port (repeatable)"
    )
    parser.add_argument(
        "--min-cosine",
        type=float,
        default=MIN_COSINE,
        metavar="X",
        help="least agreement of each pod's rows with the first pod's (default: %(default)s)",
    )
    parser.add_argument(
        "--timeout", type=float, default=120.0, help="seconds a worker call may take (default: %(default)s)"
    )
    parser.add_argument(
        "--max-seq-length",
        type=int,
        default=0,
        metavar="N",
        help="the gateway's --max-seq-length: tokens kept per input (default: 0, the model's own)",
    )
    parser.add_argument(
        "--prompts",
        default="",
        metavar="JSON",
        help="the gateway's --prompts: prompt name to prefix, merged over the model's (default: none)",
    )
    args = parser.parse_args(argv)
    try:  # the gateway's own rules for these settings, and its own merge of them (config.py)
        args.gateway = GatewayConfig(
            model_dir=args.model, max_seq_length=args.max_seq_length, prompts=args.prompts
        )
    except ValueError as error:
        parser.error(str(error))
    token = os.environ.get("KEMBED_WORKER_AUTH_TOKEN", "").strip()
    args.metadata = (("authorization", f"Bearer {token}"),) if token else ()
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return run(args)
    except (OSError, ValueError) as error:
        print(f"golden: the model directory {args.model} is unusable: {error}", file=sys.stderr)
        return 2
    except grpc.RpcError as error:
        print(
            f"golden: worker unreachable or failed: {error.code().name}: {error.details()}", file=sys.stderr
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
