"""What the gateway tokenizes with, read from a model directory: the tokenizer file and
sentence-transformers' settings (the worker's check-model reports them too).

The rules mirror sentence-transformers 6.2 (`base/modules/transformer.py`, `base/model.py`) so that the
gateway's token ids equal `SentenceTransformer.encode`'s:
- max_seq_length: `sentence_bert_config.json` `max_seq_length` when set; else the tokenizer's
  `model_max_length` (tokenizer_config.json), capped at config.json `max_position_embeddings`;
- `do_lower_case` from sentence_bert_config.json adds a Lowercase normalizer;
- prompts: `query` and `document` exist (empty) unless configured, plus `prompts` and
  `default_prompt_name` from config_sentence_transformers.json; a prompt is prepended to the text;
- texts are not stripped; the truncation side is tokenizer_config.json `truncation_side` (right);
- a Transformer that takes chat messages (sentence_bert_config.json `modality_config`, as
  sentence-transformers 6 saves an LLM reranker) renders a pair through the chat template
  (chat_template.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kembed.proto.chat_template import ChatTemplate, read_chat_template

# transformers' stand-in for "no limit" when tokenizer_config.json has no model_max_length.
_UNLIMITED = int(1e30)

Direction = Literal["right", "left"]


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """The tokenization-relevant facts of one model directory, read once at start."""

    name: str
    """Directory name; the served name when no worker has answered Info yet."""
    tokenizer_file: Path
    max_seq_length: int | None
    """Longest sequence in tokens, special tokens included; None means the model sets no limit."""
    do_lower_case: bool
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    truncation_side: Direction = "right"
    vocab_size: int | None = None
    """config.json vocab_size; the worker's Info is authoritative once it has answered."""
    id2label: dict[int, str] = field(default_factory=dict)
    """config.json id2label: a sequence classifier's (reranker's) label names, for /info."""
    chat_template: ChatTemplate | None = None
    """The chat template a (query, document) pair is rendered through (chat_template.py): an LLM
    reranker's, where sentence_bert_config.json says its Transformer takes messages; None: a pair is
    the tokenizer's own pair of texts."""
    lexical_skip: tuple[str, ...] = ()
    """The tokens a sparse (lexical) output drops: the tokenizer's cls, eos, pad and unk tokens as
    tokenizer_config.json / special_tokens_map.json name them (FlagEmbedding's BGE-M3 rule)."""

    def resolve_prompt(self, prompt_name: str | None) -> str:
        """The prompt text for `prompt_name` (default prompt when None); KeyError if unknown."""
        if prompt_name is None:
            return self.prompts.get(self.default_prompt_name, "") if self.default_prompt_name else ""
        return self.prompts[prompt_name]


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    with path.open(encoding="utf-8") as f:
        try:
            data = json.load(f)
        except ValueError as error:  # bad JSON or UTF-8: say which file
            raise ValueError(f"{path.name}: {error}") from None
    return data if isinstance(data, dict) else {}


def _transformer_dir(model_dir: Path) -> Path:
    """The folder of the Transformer module (usually the root; `0_Transformer/` in older exports)."""
    modules_file = model_dir / "modules.json"
    if modules_file.is_file():
        modules = json.loads(modules_file.read_text(encoding="utf-8"))
        for module in modules:
            if str(module.get("type", "")).endswith("Transformer"):
                path: str = module.get("path", "")
                return model_dir / path
    return model_dir


def _max_seq_length(
    sbert: dict[str, Any], tokenizer_config: dict[str, Any], config: dict[str, Any]
) -> int | None:
    if sbert.get("max_seq_length") is not None:
        return int(sbert["max_seq_length"])
    model_max = tokenizer_config.get("model_max_length") or _UNLIMITED
    max_positions = config.get("max_position_embeddings")
    if max_positions is not None and max_positions != -1:
        model_max = min(int(model_max), int(max_positions))
    return None if model_max >= _UNLIMITED else int(model_max)


def load_model_spec(model_dir: Path) -> ModelSpec:
    """Read `model_dir`'s tokenizer settings; FileNotFoundError if it has no tokenizer.json."""
    transformer_dir = _transformer_dir(model_dir)
    tokenizer_file = transformer_dir / "tokenizer.json"
    if not tokenizer_file.is_file():
        tokenizer_file = model_dir / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise FileNotFoundError(f"no tokenizer.json in {model_dir}")
    sbert = _read_json(transformer_dir / "sentence_bert_config.json")
    _refuse_chat_rendered_texts(sbert, transformer_dir)
    tokenizer_config = _read_json(transformer_dir / "tokenizer_config.json") or _read_json(
        model_dir / "tokenizer_config.json"
    )
    config = _read_json(transformer_dir / "config.json") or _read_json(model_dir / "config.json")
    st_config = _read_json(model_dir / "config_sentence_transformers.json")

    # SentenceTransformer's own defaults: empty query/document prompts that saved prompts override.
    prompts = {"query": "", "document": ""}
    prompts.update({str(k): str(v or "") for k, v in (st_config.get("prompts") or {}).items()})
    default_prompt_name = st_config.get("default_prompt_name") or None
    if default_prompt_name is not None and default_prompt_name not in prompts:
        raise ValueError(f"default_prompt_name {default_prompt_name!r} is not one of {sorted(prompts)}")
    side = tokenizer_config.get("truncation_side", "right")
    return ModelSpec(
        name=model_dir.resolve().name,
        tokenizer_file=tokenizer_file,
        max_seq_length=_max_seq_length(sbert, tokenizer_config, config),
        do_lower_case=bool(sbert.get("do_lower_case", False)),
        prompts=prompts,
        default_prompt_name=default_prompt_name,
        truncation_side="left" if side == "left" else "right",
        vocab_size=config.get("vocab_size"),
        id2label=_id2label(config),
        chat_template=read_chat_template(transformer_dir, sbert, tokenizer_config),
        lexical_skip=_lexical_skip(
            tokenizer_config,
            _read_json(transformer_dir / "special_tokens_map.json")
            or _read_json(model_dir / "special_tokens_map.json"),
            str(config.get("model_type", "")),
        ),
    )


def _refuse_chat_rendered_texts(sbert: dict[str, Any], transformer_dir: Path) -> None:
    """ValueError for an embedder whose texts sentence-transformers 6 renders through the tokenizer's
    chat template: it writes `modality_config` with `message` when the tokenizer it saved has one
    (a Qwen3-Embedding fine-tuned and saved with sentence-transformers 6, say), and then wraps every
    text as a user message (`<|im_start|>user ... <|im_end|>`). The gateway tokenizes texts as they
    are, so it would embed other ids than `SentenceTransformer.encode` does: refused, naming the fix."""
    task = sbert.get("transformer_task", "feature-extraction")
    if task == "feature-extraction" and "message" in (sbert.get("modality_config") or {}):
        raise ValueError(
            f"{transformer_dir / 'sentence_bert_config.json'}: its modality_config takes chat messages, so "
            "sentence-transformers renders every text through the tokenizer's chat template, which kembed "
            "does not do for embedders yet; to serve its texts as they are, remove \"message\" from "
            "modality_config (then sentence-transformers tokenizes them as kembed does)"
        )


LEXICAL_SKIP = ("cls_token", "eos_token", "pad_token", "unk_token")
# The special tokens a transformers tokenizer class has when its files name none: its __init__'s
# defaults (transformers 5; tests/proto/test_lexical_skip.py checks them against its signatures), by
# class name without "Fast". FlagEmbedding skips the cls, eos, pad and unk tokens of the tokenizer
# AutoTokenizer loads, whose `special_tokens_map` falls back to these.
_CLASS_SPECIALS: dict[str, tuple[str | None, ...]] = {  # (cls, eos, pad, unk): LEXICAL_SKIP's order
    "XLMRobertaTokenizer": ("<s>", "</s>", "<pad>", "<unk>"),
    "RobertaTokenizer": ("<s>", "</s>", "<pad>", "<unk>"),
    "CamembertTokenizer": ("<s>", "</s>", "<pad>", "<unk>"),
    "MPNetTokenizer": ("<s>", "</s>", "<pad>", "[UNK]"),
    "BertTokenizer": ("[CLS]", None, "[PAD]", "[UNK]"),
    "DebertaV2Tokenizer": ("[CLS]", "[SEP]", "[PAD]", "[UNK]"),
    "Qwen2Tokenizer": (None, "<|endoftext|>", "<|endoftext|>", "<|endoftext|>"),
    "GemmaTokenizer": (None, "<eos>", "<pad>", "<unk>"),
}
# The class AutoTokenizer picks by config.json's model_type when tokenizer_config.json names none
# (transformers' TOKENIZER_MAPPING_NAMES, for the model types kembed serves)
_MODEL_TYPE_TOKENIZERS = {
    "xlm-roberta": "XLMRobertaTokenizer", "roberta": "RobertaTokenizer", "camembert": "CamembertTokenizer",
    "mpnet": "MPNetTokenizer", "bert": "BertTokenizer", "nomic_bert": "BertTokenizer",
    "deberta-v2": "DebertaV2Tokenizer", "qwen2": "Qwen2Tokenizer", "qwen3": "Qwen2Tokenizer",
    "gemma3": "GemmaTokenizer", "gemma3_text": "GemmaTokenizer",
}  # fmt: skip


def _lexical_skip(
    tokenizer_config: dict[str, Any], special_map: dict[str, Any], model_type: str = ""
) -> tuple[str, ...]:
    """The tokens a lexical (BGE-M3) sparse vector leaves out, as FlagEmbedding does: the cls, eos,
    pad and unk tokens of the tokenizer, as its files name them, else as its class has them by
    default (`_CLASS_SPECIALS`); one they name as null is none."""
    tokenizer_class = str(tokenizer_config.get("tokenizer_class") or "").removesuffix("Fast")
    tokenizer_class = tokenizer_class or _MODEL_TYPE_TOKENIZERS.get(model_type, "")
    defaults = dict(zip(LEXICAL_SKIP, _CLASS_SPECIALS.get(tokenizer_class, ()), strict=False))
    tokens = []
    for name in LEXICAL_SKIP:
        if name in special_map:
            token = special_map[name]
        elif name in tokenizer_config:
            token = tokenizer_config[name]
        else:
            token = defaults.get(name)
        if isinstance(token, dict):  # an AddedToken as saved: {"content": ...}
            token = token.get("content")
        if isinstance(token, str):
            tokens.append(token)
    return tuple(tokens)


def _id2label(config: dict[str, Any]) -> dict[int, str]:
    labels = config.get("id2label")
    if not isinstance(labels, dict):
        return {}
    try:
        return {int(i): str(label) for i, label in sorted(labels.items(), key=lambda kv: int(kv[0]))}
    except ValueError:
        return {}
