"""`kembed-worker check-model DIR`: whether kembed can serve a model directory, and how, before it is
packaged and deployed.

Every fact comes from the code that serves the model, never from rules of its own: the worker's engine
reads config.json, the sentence-transformers pipeline and the weights (`engine.model_dir`, the family
dispatch in `engine.models`), and the gateway reads the tokenizer and its settings (`proto.model_files`)
and answers the routes of the served task (`proto.routes`). With `--load` it builds the engine on
this machine's CPU, as a worker would, and runs one input through it.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kembed.proto.model_files import ModelSpec, load_model_spec
from kembed.proto.routes import TASK_ROUTES
from kembed.worker.config import WorkerConfig
from kembed.worker.errors import InvalidInput, StartupError

if TYPE_CHECKING:  # torch's modules load only where a check runs (`--help` answers at once)
    from kembed.worker.engine.layers.attention import AttentionShape

# What a worker's --dtype auto gives on each device.
DEVICES = ("cuda", "cpu")


@dataclass
class ModelCheck:
    """What `check` found, in the order it looked; `reason` says why the directory is not servable."""

    path: str
    is_servable: bool = False
    reason: str = ""
    model_type: str = ""
    architectures: list[str] = field(default_factory=list)
    family: str = ""  # an embedder's ("bert", "qwen3", "mpnet", ...), or a scorer's ("cross-encoder", ...)
    network: str = ""  # the network served, in a line
    adapters: list[str] = field(default_factory=list)  # task adapters a deployment picks one of
    custom_code: str = ""  # config.json auto_map, which kembed does not run (its own code serves the family)
    task: str = ""  # "embed" or "score", as the worker's Info reports it
    pooling: str = ""  # embedders: "cls" | "mean" | "last"
    pooling_source: str = ""
    normalize: bool = False
    dense: list[str] = field(default_factory=list)  # embedders: the Dense modules after pooling
    dimensions: int | None = None  # embedders: the vector size
    heads: list[str] = field(default_factory=list)  # embedders: BGE-M3's heads found, and what each gives
    outputs: list[str] = field(default_factory=list)  # embedders: the outputs served (GET /info's)
    labels: list[str] = field(default_factory=list)  # scorers: config.json id2label
    # the attention served: how it runs on a GPU where a position bias decides it, else its pattern
    # (causal or not and why, sliding windows)
    attention: str = ""
    score: str = ""  # LLM rerankers: which logits the score is, e.g. "logit('yes') - logit('no') ..."
    score_token_ids: list[int] = field(default_factory=list)  # LLM rerankers: LogitScore's true, false ids
    pair_template: str = ""  # LLM rerankers: a pair as the chat template renders it, {query} and {document}
    max_positions: int | None = None  # the position table: the longest sequence the network takes
    max_seq_length: int | None = None  # tokens kept per input (the gateway truncates to it)
    do_lower_case: bool = False
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    tokenizer_file: str = ""
    weight_files: list[str] = field(default_factory=list)
    weight_dtypes: list[str] = field(default_factory=list)
    served_dtypes: dict[str, str] = field(default_factory=dict)  # device -> dtype under --dtype auto
    routes: list[str] = field(default_factory=list)  # the gateway's routes particular to the task
    loaded: str = ""  # with --load: what the engine built on the CPU gave
    notes: list[str] = field(default_factory=list)  # what a user may have meant otherwise

    @property
    def verdict(self) -> str:
        """One line: what kembed serves from the directory, or why nothing."""
        if not self.is_servable:
            return f"not servable: {self.reason}"
        if self.task == "score":
            return "servable: scores (rerank)"
        if self.pooling.startswith("splade"):
            return f"servable: sparse vectors ({self.pooling})"
        return f"servable: embeddings, {self.pooling} pooling, {'' if self.normalize else 'not '}normalised"


def check(path: Path, *, load: bool = False) -> ModelCheck:
    """Inspect `path` as a worker and a gateway would load it; with `load`, build it on the CPU."""
    result = ModelCheck(path=str(path))
    try:
        _inspect(Path(path), result)
        if load:
            _load(Path(path), result)
    except (InvalidInput, StartupError, FileNotFoundError, ValueError, KeyError, RuntimeError) as exc:
        result.reason = str(exc) if not isinstance(exc, KeyError) else f"config.json lacks {exc}"
        return result
    result.is_servable = True
    return result


def _inspect(path: Path, result: ModelCheck) -> None:
    # torch's modules, imported here so that `check-model --help` answers at once
    from kembed.worker.engine.engine import resolve_dtype
    from kembed.worker.engine.models.cross_encoder import cross_encoder_architecture
    from kembed.worker.engine.models.families import (
        SCORE_FAMILIES,
        adapters_of,
        attention_shape,
        describe_attention,
        family_of,
        network_of,
        pooling_of,
        shape_of,
    )
    from kembed.worker.engine.models.model_dir import read_model_dir, weight_files

    if not path.is_dir():
        raise InvalidInput(f"{path} is not a directory")
    model_dir = read_model_dir(path)
    result.model_type = model_dir.model_type
    result.architectures = [str(a) for a in model_dir.config.get("architectures") or ()]
    result.family = family_of(model_dir)
    shape = shape_of(model_dir)
    result.network = network_of(model_dir)
    result.adapters = list(adapters_of(model_dir))
    result.max_positions = shape.max_sequence_length
    # a position bias decides how attention runs on a GPU; else the pattern (causal, windows)
    result.attention = _attention(attention_shape(model_dir)) or describe_attention(model_dir)
    custom = model_dir.config.get("auto_map")
    if custom:
        result.custom_code = ", ".join(f"{name}: {target}" for name, target in dict(custom).items())
    is_causal_lm = any(a.endswith("ForCausalLM") for a in result.architectures)
    if is_causal_lm and model_dir.logit_score is None and not (path / "modules.json").is_file():
        result.notes.append(
            "a causal LM without modules.json is served as an embedder; an LLM reranker (Qwen3-Reranker) "
            "is served as one when sentence-transformers saved it as a CrossEncoder (docs/your-model.md)"
        )
    if result.family in SCORE_FAMILIES:
        result.task = "score"
        if result.family == "cross-encoder":
            cross_encoder_architecture(model_dir.config)
        if model_dir.logit_score is not None:  # an LLM reranker
            result.score_token_ids = list(model_dir.logit_score.token_ids)
    else:
        result.task = "embed"
        result.pooling = pooling_of(model_dir)
        result.pooling_source = (
            "modules.json"
            if model_dir.pooling is not None or model_dir.splade is not None
            else f"no modules.json: the {result.family} default"
        )
        result.normalize = model_dir.normalize
        result.dense = [
            f"{spec.path.name}: {spec.in_features} -> {spec.out_features}, {spec.activation_name}"
            + (", residual" if spec.use_residual else "")
            for spec in model_dir.dense
        ]
        result.dimensions = model_dir.dense[-1].out_features if model_dir.dense else shape.hidden_size
        if model_dir.splade is not None:  # a weight per vocabulary id
            result.dimensions = shape.vocab_size
            result.outputs = ["sparse"]
        else:
            _read_heads(path, shape.hidden_size, result)
    files = weight_files(path)
    result.weight_files = [f.name for f in files]
    result.weight_dtypes = _checkpoint_dtypes(files)
    import torch

    result.served_dtypes = {
        device: str(resolve_dtype("auto", torch.device(device))).removeprefix("torch.") for device in DEVICES
    }
    spec = load_model_spec(path)  # FileNotFoundError without tokenizer.json
    _read_spec(spec, path, result)
    result.routes = _routes(result.task, result.outputs)


def _attention(shape: AttentionShape) -> str:
    """How a GPU worker runs the attention of a model whose scores carry a position bias ("": none)."""
    from kembed.worker.engine.layers.attention_backends import bias_backends
    from kembed.worker.engine.layers.triton_attention import HEAD_DIMS

    if not shape.bias:
        return ""
    eager = "sdpa-padded in the eager engine (no CUDA graphs)"
    backends = [b for b in bias_backends(shape.bias) if b != "triton" or shape.head_dim in HEAD_DIMS]
    bias = f"a {shape.bias} position bias"
    if not backends:
        return f"{bias}, which no varlen kernel adds at head size {shape.head_dim}: on a GPU {eager}"
    return f"{bias}: on a GPU {', '.join(backends)} in CUDA graphs (where installed), else {eager}"


def _read_spec(spec: ModelSpec, path: Path, result: ModelCheck) -> None:
    from tokenizers import Tokenizer  # the gateway's tokenizer library (a dependency of the worker's too)

    result.tokenizer_file = str(spec.tokenizer_file.relative_to(path))
    tokenizer = Tokenizer.from_file(str(spec.tokenizer_file))  # the file the gateway will load, parsed
    result.max_seq_length = spec.max_seq_length
    result.do_lower_case = spec.do_lower_case
    result.prompts = dict(spec.prompts)
    result.default_prompt_name = spec.default_prompt_name
    result.labels = list(spec.id2label.values()) if result.family == "cross-encoder" else []
    if result.score_token_ids:
        true, *false = (repr(tokenizer.id_to_token(i)) for i in result.score_token_ids)
        logits = f"logit({true})" + "".join(f" - logit({name})" for name in false)
        ids = ", ".join(map(str, result.score_token_ids))
        result.score = f"{logits} at the last token (LogitScore; ids {ids})"
    if spec.chat_template is not None:  # rendered as the gateway will (a template it cannot cut is refused)
        system = spec.resolve_prompt(None) or None
        pieces = spec.chat_template.pieces(system)
        rendered = pieces.join("{query}", "{document}")
        result.pair_template = f"{spec.chat_template.file}: {rendered!r}"


def _checkpoint_dtypes(files: list[Path]) -> list[str]:
    """The dtypes the safetensors files hold, read from their headers (no tensor is loaded)."""
    from safetensors import safe_open

    dtypes: set[str] = set()
    for file in files:
        with safe_open(str(file), framework="pt") as weights:
            dtypes.update(weights.get_slice(key).get_dtype() for key in weights.keys())  # noqa: SIM118
    return sorted(_SAFETENSORS_DTYPES.get(dtype, dtype) for dtype in dtypes)


_SAFETENSORS_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64"}


def _read_heads(path: Path, hidden: int, result: ModelCheck) -> None:
    """BGE-M3's heads the directory has, checked as the worker checks them at start (`check_heads`),
    and the outputs served: dense, each head's, and token vectors where no Dense module changed the
    width (proto/outputs.py lays every output in rows of the dense width)."""
    from kembed.worker.engine.models.heads import check_heads, head_shapes

    assert result.dimensions is not None  # an embedder's, set before
    shapes = head_shapes(path)
    check_heads(shapes, hidden, result.dimensions)
    gives = {"sparse_linear": "sparse", "colbert_linear": "colbert"}
    result.heads = [f"{name}: {shape[1]} -> {shape[0]} ({gives[name]})" for name, shape in shapes.items()]
    result.outputs = ["dense", *(gives[name] for name in shapes)]
    if hidden == result.dimensions:
        result.outputs.append("tokens")


# The embedding routes that need an output beside dense (GET /info's `outputs`): the gateway leaves
# a route out of its document for a model without it (gateway/api/openapi.py).
OUTPUT_ROUTES = {"/embed_sparse": "sparse", "/embed_all": "tokens"}


def _routes(task: str, outputs: list[str]) -> list[str]:
    """The gateway's routes particular to a model of `task` with `outputs` (an embedder's): a model
    of sparse vectors alone (SPLADE) answers those that give them; one without a sparse head has
    no /embed_sparse, one whose Dense modules changed the width no /embed_all."""
    routes = TASK_ROUTES.get(task, ())
    if outputs == ["sparse"]:
        routes = tuple(path for path in routes if path in SPARSE_ROUTES)
    return [
        f"POST {path}" for path in routes if path not in OUTPUT_ROUTES or OUTPUT_ROUTES[path] in outputs
    ]


SPARSE_ROUTES = ("/v1/embeddings", "/embed_sparse")  # what a model with sparse vectors alone answers


def _load(path: Path, result: ModelCheck) -> None:
    """Build the engine on the CPU as a worker would, then run one tokenized input through it."""
    from tokenizers import Tokenizer

    from kembed.worker.engine import Engine, load_engine

    engine = load_engine(WorkerConfig(model=path, device="cpu", prewarm="none"))
    assert isinstance(engine, Engine), "a CPU engine is the eager one"
    tokenizer = Tokenizer.from_file(str(path / result.tokenizer_file))
    tokenizer.no_padding()  # as the gateway loads it: no stored padding or truncation
    tokenizer.no_truncation()
    query, document = "what is kembed?", "kembed serves text embeddings from GPUs."
    spec = load_model_spec(path)
    if spec.chat_template is not None:  # an LLM reranker's pair: its chat template, as the gateway renders it
        text = spec.chat_template.pieces(spec.resolve_prompt(None) or None).join(query, document)
        encoding = tokenizer.encode(text, add_special_tokens=False)
    elif result.task == "score":
        encoding = tokenizer.encode(query, document)
    else:
        encoding = tokenizer.encode("kembed serves text embeddings from GPUs.")
    ids = np.asarray(encoding.ids, np.int32)
    if spec.max_seq_length is not None:  # as the gateway would truncate (keeping the template's tail)
        ids = ids[max(0, len(ids) - spec.max_seq_length) :]
    if ids.size and int(ids.max()) >= engine.info.vocab_size:
        raise InvalidInput(
            f"the tokenizer gives id {int(ids.max())}, past the model's vocabulary ({engine.info.vocab_size})"
        )
    types = np.asarray(encoding.type_ids, np.int32)
    rows = engine.step(engine.pack(ids, np.array([len(ids)], np.int32), types)).wait()
    if rows.shape != (1, engine.info.dimensions) or not np.isfinite(rows).all():
        raise RuntimeError(f"one input gave rows of shape {rows.shape}, finite: {np.isfinite(rows).all()}")
    result.dimensions = engine.info.dimensions if result.task == "embed" else result.dimensions
    what = "vector" if result.task == "embed" else "score"
    result.loaded = (
        f"built on the CPU as {engine.info.dtype} in the engine; one input ({len(ids)} tokens) gave a finite "
        f"{what} of {engine.info.dimensions}"
    )


def render(result: ModelCheck) -> str:
    """The report as aligned lines, the verdict last."""
    lines: list[tuple[str, str]] = [("model directory", result.path)]
    if result.model_type:
        architectures = ", ".join(result.architectures) or "none listed"
        lines.append(("architecture", f"{architectures} (model_type {result.model_type})"))
    if result.family:
        scorer = "an LLM reranker" if result.score else "a cross-encoder"
        served = f"relevance scores ({scorer})" if result.task == "score" else "embeddings"
        code = f"{result.model_type} decoder and LogitScore" if result.score else result.family
        lines.append(("serves", f"{served}: task {result.task}, kembed's {code} code"))
    if result.network:
        lines.append(("network", result.network))
    if result.adapters:
        tasks = ", ".join(result.adapters)
        lines.append(("adapters", f"{tasks} (one per deployment: --adapter; without, the base weights)"))
    if result.custom_code:
        lines.append(
            (
                "custom code",
                f"config.json auto_map ({result.custom_code}) is not run: kembed's own code serves it",
            )
        )
    if result.pooling:
        lines.append(("pooling", f"{result.pooling} ({result.pooling_source})"))
        if result.dense:
            lines.append(("dense", "; ".join(result.dense) + " (after pooling, in modules.json)"))
        lines.append(("normalised", "yes (Normalize in modules.json)" if result.normalize else "no"))
    if result.attention:
        lines.append(("attention", result.attention))
    if result.dimensions is not None:
        lines.append(("dimensions", str(result.dimensions)))
    if result.heads:
        lines.append(("heads", "; ".join(result.heads) + " (BGE-M3's, beside the encoder)"))
    if result.outputs:
        lines.append(("outputs", ", ".join(result.outputs)))
    if result.labels:
        lines.append(("labels", ", ".join(result.labels)))
    if result.score:
        lines.append(("score", result.score))
    if result.pair_template:
        lines.append(("pair template", result.pair_template))
    if result.weight_files:
        lines.append(("weights", f"{', '.join(result.weight_files)} ({', '.join(result.weight_dtypes)})"))
    if result.served_dtypes:
        runs = ", ".join(f"{dtype} on {device}" for device, dtype in result.served_dtypes.items())
        lines.append(("dtype", f"{runs} (--dtype auto; spec.model.dtype sets it)"))
    if result.tokenizer_file:
        lines.append(("tokenizer", result.tokenizer_file + (", lowercased" if result.do_lower_case else "")))
        limit = "no limit" if result.max_seq_length is None else f"{result.max_seq_length} tokens per input"
        lines.append(("max length", f"{limit} (position table: {result.max_positions})"))
        prompts = ", ".join(f"{name}: {text!r}" for name, text in result.prompts.items())
        lines.append(("prompts", f"{prompts}; default: {result.default_prompt_name or 'none'}"))
    if result.routes:
        lines.append(
            ("routes", ", ".join(result.routes) + " (and those of any model: /tokenize, /info, ...)")
        )
    if result.loaded:
        lines.append(("loaded", result.loaded))
    lines.extend(("note", note) for note in result.notes)
    lines.append(("verdict", result.verdict))
    width = max(len(name) for name, _ in lines)
    return "\n".join(f"{name.ljust(width)}  {value}" for name, value in lines)


def main(argv: list[str]) -> int:
    """`check-model DIR [...]` (`argv` from the command's name on): 0 when the directory is
    servable, 1 when not (the reason printed), 2 for a usage error."""
    if argv and argv[0] == "check-model":
        argv = argv[1:]
    parser = argparse.ArgumentParser(
        prog="kembed-worker check-model",
        description="Say whether kembed can serve a Hugging Face model directory, and how: family, "
        "pooling, normalisation, dtype, max length, prompts, task and routes; or why not. Exit 0 "
        "when servable, 1 when not.",
    )
    parser.add_argument(
        "model", type=Path, help="a local model directory (config.json, safetensors, tokenizer.json)"
    )
    parser.add_argument("--json", action="store_true", help="print the findings as one JSON object")
    parser.add_argument(
        "--load", action="store_true", help="also build the model on this CPU and run one input through it"
    )
    args = parser.parse_args(argv)
    result = check(args.model, load=args.load)
    if args.json:
        print(json.dumps(_as_json(result), indent=2))
    else:
        print(render(result))
    return 0 if result.is_servable else 1


def _as_json(result: ModelCheck) -> dict[str, Any]:
    return {**asdict(result), "verdict": result.verdict}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
