"""Truncating tokenization that tokenizes only a window of a long text gives exactly the ids of
tokenizing all of it and truncating, for the tokenizer families kembed serves (WordPiece, byte-level
BPE, SentencePiece-style Metaspace), both truncation sides, and texts built to stress the cut: no
spaces, newlines only, CJK, long words. And an 8 MB text costs what its kept part costs."""

import random
import resource
import subprocess
import sys

import pytest
from gateway_fakes import BUNDLED_MODEL_DIR
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from kembed.gateway.model_files import load_model_spec
from kembed.gateway.tokenization import (
    _encode_ids,
    _encode_ids_truncated,
    _load_base,
    _truncating,
)

WORDS = [
    "search",
    "embedding",
    "vector",
    "semantic",
    "retrieval",
    "gateway",
    "worker",
    "batch",
    "token",
    "graph",
    "the",
    "of",
    "and",
    "a",
    "to",
    "in",
    "indexing",
    "re-ranking",
    "naïve",
    "café",
    "東京",
    "大学",
    "语义",
    "检索",
    "ünïcödé",
    "🚀",
    "supercalifragilisticexpialidocious",
]


def corpus(rng: random.Random, num_words: int, style: str) -> str:
    words = [rng.choice(WORDS) for _ in range(num_words)]
    if style == "spaces":
        return " ".join(words)
    if style == "newlines":
        return "\n".join(words)
    if style == "no-spaces":
        return "".join(words)
    if style == "cjk":
        return "".join(rng.choice("東京大学语义检索向量嵌入") for _ in range(num_words * 3))
    if style == "long-words":
        return " ".join(w * rng.randrange(1, 60) for w in words)
    return " , ".join(words) + "!"


def bert() -> Tokenizer:
    return _load_base(load_model_spec(BUNDLED_MODEL_DIR))


def trained(kind: str) -> Tokenizer:
    rng = random.Random(0)
    texts = [corpus(rng, 200, style) for style in ("spaces", "cjk", "long-words", "punctuation")] * 5
    if kind == "byte-level-bpe":  # Qwen3-like
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=800, special_tokens=["<|endoftext|>"])
        tokenizer.train_from_iterator(texts, trainer)
        tokenizer.post_processor = processors.TemplateProcessing(
            single="$A <|endoftext|>",
            pair="$A <|endoftext|> $B:1 <|endoftext|>:1",
            special_tokens=[("<|endoftext|>", 0)],
        )
    else:  # XLM-R / BGE-M3-like: Metaspace pre-tokenizer, <s> ... </s>
        tokenizer = Tokenizer(models.Unigram())
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        trainer = trainers.UnigramTrainer(
            vocab_size=600, special_tokens=["<s>", "</s>", "<unk>"], unk_token="<unk>"
        )
        tokenizer.train_from_iterator(texts, trainer)
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 1)]
        )
    return tokenizer


@pytest.mark.parametrize("family", ["wordpiece", "byte-level-bpe", "metaspace"])
@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("max_length", [16, 128])
def test_the_window_gives_the_ids_of_the_whole_text(family, side, max_length):
    base = bert() if family == "wordpiece" else trained(family)
    truncating = _truncating(base, max_length, side)
    rng = random.Random(f"{family}-{side}-{max_length}")
    styles = ("spaces", "newlines", "no-spaces", "cjk", "long-words", "punctuation")
    texts = [corpus(rng, rng.choice([5, 50, 400, 3000]), style) for style in styles for _ in range(4)]
    windowed = _encode_ids_truncated(truncating, base, texts, max_length, side)
    whole = _encode_ids(truncating, texts)
    for text, got, want in zip(texts, windowed, whole, strict=True):
        assert got.tolist() == want.tolist(), text[:80]


def test_an_8_mb_text_costs_what_its_kept_part_costs():
    # In a fresh process: peak RSS after tokenizing (truncating to 256) one 7.8 MB text, against
    # after tokenizing a 100-character one. Tokenizing all of it took 2.5 s and ~0.5 GB here.
    code = f"""
import resource, sys
sys.path[:0] = {sys.path!r}
from kembed.gateway.model_files import load_model_spec
from kembed.gateway.tokenization import _load_base, _truncating, _encode_ids_truncated
from pathlib import Path
base = _load_base(load_model_spec(Path({str(BUNDLED_MODEL_DIR)!r})))
truncating = _truncating(base, 256, "right")
_encode_ids_truncated(truncating, base, ["warm " * 20], 256, "right")
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
text = ("semantic search with embeddings " * 250000)[:7_800_000]
ids = _encode_ids_truncated(truncating, base, [text], 256, "right")
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(len(ids[0]), (after - before) // 1024)
"""
    out = subprocess.run(
        [sys.executable, "-P", "-c", code], capture_output=True, text=True, check=True
    ).stdout
    num_ids, grown_mib = map(int, out.split())
    assert num_ids == 256
    assert grown_mib < 64  # the text itself is ~8 MB (and its copies); the whole tokenization ~500
    assert resource  # the measuring is done in the child
