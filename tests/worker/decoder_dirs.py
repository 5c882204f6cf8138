"""Test model directories of the decoder families (Qwen2, Qwen3, EuroBERT; LLM rerankers on Qwen3 and
Qwen2, saved by sentence-transformers as CrossEncoders) with random weights and a
small real tokenizer: a byte-level BPE trained here with the `tokenizers` library, Qwen's split
pattern and special tokens (`<|endoftext|>`, `<|im_start|>`, `<|im_end|>`), "yes" and "no" among
its words, and where asked EuroBERT's `<|begin_of_text|>`/`<|end_of_text|>` around every text."""

import json
import shutil
from pathlib import Path

import torch
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|end_of_text|>"]
CORPUS = [
    "yes no Judge whether the Document meets the requirements based on the Query and the Instruct",
    "what is the capital of france? paris is the capital and the largest city of france",
    "the quick brown fox jumps over the lazy dog; 0 1 2 3 4 5 6 7 8 9",
    "Given a web search query, retrieve relevant passages that answer the query",
    "kembed serves text embeddings and relevance scores from GPU workers",
]
TEXTS = [
    "paris",
    "what is the capital of france?",
    "the quick brown fox jumps over the lazy dog " * 3,
    "yes",
    "kembed serves text embeddings and relevance scores from GPU workers, " * 4,
    "no no no",
    "Given a web search query, retrieve relevant passages",
]


def bpe_tokenizer(
    *, chat_template: str | None = None, bos_eos: bool = False
) -> transformers.PreTrainedTokenizerFast:
    """The test tokenizer: Qwen-like (no special tokens added to a text), or EuroBERT-like (`bos_eos`)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=420, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(CORPUS * 10, trainer)
    if bos_eos:
        bos, eos = SPECIALS[3], SPECIALS[4]
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A {eos}",
            pair=f"{bos} $A {eos} $B:1 {eos}:1",
            special_tokens=[(bos, tokenizer.token_to_id(bos)), (eos, tokenizer.token_to_id(eos))],
        )
    extra = {"bos_token": SPECIALS[3], "eos_token": SPECIALS[4]} if bos_eos else {"eos_token": SPECIALS[2]}
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token=SPECIALS[0], chat_template=chat_template, **extra
    )


VOCAB_SIZE = 420
TINY = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,  # grouped-query attention
    head_dim=16,
    intermediate_size=128,
    max_position_embeddings=256,
    # Not the 1e6 default: short test sequences then rotate enough for wrong positions to show.
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    initializer_range=0.1,  # sharper attention than 0.02, so causal and bidirectional differ clearly
)
CLASSES = {
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2Model, transformers.Qwen2ForCausalLM),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3Model, transformers.Qwen3ForCausalLM),
    "eurobert": (transformers.EuroBertConfig, transformers.EuroBertModel, None),
}


def randomized(model: torch.nn.Module) -> torch.nn.Module:
    """Norm weights start at one and biases at zero: randomise them, so a misplaced one shows."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                param.normal_(0.0, 0.2)
    return model.eval()


def save_decoder(
    path: Path, family: str, *, causal_lm: bool = False, seed: int = 0, **overrides
) -> torch.nn.Module:
    """A random tiny `family` model (its base model, or its *ForCausalLM) saved as safetensors, with
    config.json `overrides` (written as given, e.g. `is_causal: false`)."""
    config_cls, base_cls, lm_cls = CLASSES[family]
    torch.manual_seed(seed)
    # EuroBERT's defaults name ids of its real 128k vocabulary: the test tokenizer's instead
    ids = (
        dict(pad_token_id=0, bos_token_id=3, eos_token_id=4, mask_token_id=1) if family == "eurobert" else {}
    )
    config = config_cls(**{**TINY, **ids, **{k: v for k, v in overrides.items() if k != "extra_config"}})
    model = randomized((lm_cls if causal_lm else base_cls)(config))
    model.save_pretrained(path)
    extra = overrides.get("extra_config")
    if extra:  # fields the config class does not take, written into config.json afterwards
        config_file = path / "config.json"
        config_file.write_text(json.dumps({**json.loads(config_file.read_text()), **extra}))
    return model


# Qwen3-Reranker's template as sentence-transformers' converted checkpoints ship it (the instruction
# from the system message, a default where there is none; the assistant turn opened, thinking closed).
QWEN3_RERANKER_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
    'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
    '<Instruct>: {{ messages | selectattr("role", "eq", "system") | map(attribute="content") | first '
    '| default("Given a web search query, retrieve relevant passages that answer the query") }}\n'
    '<Query>: {{ messages | selectattr("role", "eq", "query") | map(attribute="content") | first }}\n'
    '<Document>: {{ messages | selectattr("role", "eq", "document") | map(attribute="content") | first }}'
    "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
)
# mxbai-rerank-v2's shape: a Qwen2 causal LM, its own prompt, the document first.
MXBAI_TEMPLATE = (
    "{% for m in messages %}{% if m.role == 'document' %}<|im_start|>document\n{{ m.content }}<|im_end|>\n"
    "{% endif %}{% endfor %}{% for m in messages %}{% if m.role == 'query' %}<|im_start|>query\n"
    "{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}<|im_start|>relevant\n"
)


def reranker_dir(
    tmp_path,
    family: str,
    template: str,
    *,
    tied: bool = False,
    only_true: bool = False,
    shape: dict | None = None,
    **kwargs,
):
    """A random tiny `family` causal LM saved by `CrossEncoder(...).save` (`shape`: config fields over
    TINY's; `kwargs`: CrossEncoder's)."""
    raw, path = tmp_path / "raw", tmp_path / "model"
    raw.mkdir(parents=True)
    save_decoder(raw, family, causal_lm=True, tie_word_embeddings=tied, **(shape or {}))
    tokenizer = bpe_tokenizer(chat_template=template)
    tokenizer.save_pretrained(raw)
    from sentence_transformers import CrossEncoder
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.cross_encoder.modules import LogitScore

    if only_true:  # LogitScore of one token: its logit alone
        transformer = Transformer(str(raw), transformer_task="text-generation")
        yes = tokenizer.convert_tokens_to_ids("yes")
        CrossEncoder(modules=[transformer, LogitScore(yes)], device="cpu", **kwargs).save(str(path))
    else:  # CrossEncoder's own default for a *ForCausalLM: LogitScore of "yes" and "no"
        CrossEncoder(str(raw), device="cpu", **kwargs).save(str(path))
    shutil.rmtree(raw)
    return path
