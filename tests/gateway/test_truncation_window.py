"""Truncating tokenization that tokenizes only a window of a long text gives exactly the ids of
tokenizing all of it and truncating, for the tokenizer families kembed serves (WordPiece, byte-level
BPE, SentencePiece-style Metaspace), both truncation sides, and texts built to stress the cut: no
spaces, newlines only, CJK, long words. And an 8 MB text costs what its kept part costs."""

import random
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from gateway_fakes import BUNDLED_MODEL_DIR
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from kembed.gateway.tokenizing.tokenization import _encode_pairs, _OverLongPair, _pair_lengths
from kembed.gateway.tokenizing.tokenizer_load import (
    encode_ids,
    encode_ids_truncated,
    load_tokenizer,
    truncating_tokenizer,
)
from kembed.gateway.tokenizing.windows import most_chars
from kembed.proto.model_files import load_model_spec

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
    if style == "runs":  # runs of mixed whitespace between words
        return "".join(w + rng.choice([" ", "  ", "   ", "\n", " \n ", "\n\n", "\t ", " \t"]) for w in words)
    if style == "no-spaces":
        return "".join(words)
    if style == "cjk":
        return "".join(rng.choice("東京大学语义检索向量嵌入") for _ in range(num_words * 3))
    if style == "long-words":
        return " ".join(w * rng.randrange(1, 60) for w in words)
    return " , ".join(words) + "!"


def bert() -> Tokenizer:
    return load_tokenizer(load_model_spec(BUNDLED_MODEL_DIR))


FIXTURES = Path(__file__).resolve().parent / "fixtures"


def trained(kind: str) -> Tokenizer:
    """A small tokenizer of `kind` trained on the corpus, frozen in tests/gateway/fixtures: the
    tokenizers library's trainers are not deterministic (six trainings of the Unigram model gave
    six different models, with or without parallelism), and a model whose scores tie on a
    repetitive long word made a test fail one run in a few. `train(kind)` made the frozen ones."""
    return Tokenizer.from_file(str(FIXTURES / f"trained-{kind}.json"))


def train(kind: str) -> Tokenizer:
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
    truncating = truncating_tokenizer(base, max_length, side)
    rng = random.Random(f"{family}-{side}-{max_length}")
    styles = ("spaces", "newlines", "runs", "no-spaces", "cjk", "long-words", "punctuation")
    texts = [corpus(rng, rng.choice([5, 50, 400, 3000]), style) for style in styles for _ in range(4)]
    windowed = encode_ids_truncated(truncating, base, texts, max_length, side)
    whole = encode_ids(truncating, texts)
    for text, got, want in zip(texts, windowed, whole, strict=True):
        assert got.tolist() == want.tolist(), text[:80]


@pytest.mark.parametrize(
    ("make_text", "num_ids"),
    [
        ('("semantic search with embeddings " * 250000)[:7_800_000]', 256),  # whole: 2.5 s, ~0.5 GB
        ('"東京大学语义检索向量嵌入" * 216_667', 256),  # 7.8 MB of CJK: 3.1 s, 0.7 GB
        ('"abcdefghij" * 780_000', 3),  # one word, so [CLS] [UNK] [SEP]: 1.8 s, 0.4 GB
    ],
    ids=["words", "cjk", "one-word"],
)
def test_an_8_mb_text_costs_what_its_kept_part_costs(make_text, num_ids):
    # In a fresh process: peak RSS after tokenizing (truncating to 256) one ~8 MB text, against
    # after tokenizing a 100-character one. Tokenizing all of it took the seconds and memory above.
    code = f"""
import resource, sys
sys.path[:0] = {sys.path!r}
from kembed.proto.model_files import load_model_spec
from kembed.gateway.tokenizing.tokenizer_load import (
    encode_ids_truncated, load_tokenizer, truncating_tokenizer,
)
from pathlib import Path
base = load_tokenizer(load_model_spec(Path({str(BUNDLED_MODEL_DIR)!r})))
truncating = truncating_tokenizer(base, 256, "right")
encode_ids_truncated(truncating, base, ["warm " * 20], 256, "right")
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
text = {make_text}
ids = encode_ids_truncated(truncating, base, [text], 256, "right")
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(len(ids[0]), (after - before) // 1024)
"""
    out = subprocess.run(
        [sys.executable, "-P", "-c", code], capture_output=True, text=True, check=True
    ).stdout
    got_ids, grown_mib = map(int, out.split())
    assert got_ids == num_ids
    assert grown_mib < 64  # the text itself is ~8 MB (and its copies); the whole tokenization ~500
    assert resource  # the measuring is done in the child


class CountingTokenizer:
    """Passes calls to a tokenizer and counts the characters it was given to tokenize."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer, self.num_chars = tokenizer, 0

    def encode(self, text, *args, **kwargs):
        self.num_chars += len(text)
        return self.tokenizer.encode(text, *args, **kwargs)

    def encode_batch_fast(self, texts, *args, **kwargs):
        self.num_chars += sum(len(t) for t in texts)
        return self.tokenizer.encode_batch_fast(texts, *args, **kwargs)

    encode_batch = encode_batch_fast


@pytest.mark.parametrize("family", ["wordpiece", "byte-level-bpe", "metaspace"])
@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("max_length", [16, 17, 128])
def test_pairs_from_one_tokenization_per_side_equal_the_whole_pair_truncated(family, side, max_length):
    """Query tokenized once, each document once, only in windows, the pair assembled from ids: for
    sides of up to a few hundred tokens, the library's own pair encoding with longest_first (it
    keeps the cut tokens as overflowing pieces and pairs every piece with every other, so longer
    sides would take it minutes); for long sides, the whole texts tokenized and cut by the
    library's rule. Budgets odd and even (16/17/128 less 2, 3 or 4 special tokens), ties included."""
    base = bert() if family == "wordpiece" else trained(family)
    truncating = truncating_tokenizer(base, max_length, side)
    budget = max_length - truncating.num_special_tokens_to_add(True)
    rng = random.Random(f"pairs-{family}-{side}-{max_length}")
    styles = ["spaces", "cjk", "long-words", "no-spaces", "newlines", "runs"]
    short = [corpus(rng, rng.choice([1, 3, 6, 7, 8, 9, 30]), rng.choice(styles)) for _ in range(30)]
    long = [corpus(rng, rng.choice([300, 3000]), rng.choice(styles)) for _ in range(8)]
    for query in (short[0], short[-1], corpus(rng, 7, "spaces"), "x"):
        ids, type_ids = _encode_pairs(truncating, base, query, [*short, short[0]], max_length, side, True)
        want = [truncating.encode(query, text) for text in [*short, short[0]]]
        assert [row.tolist() for row in ids] == [e.ids for e in want], query[:40]
        assert [row.tolist() for row in type_ids] == [e.type_ids for e in want], query[:40]
    num_specials = truncating.num_special_tokens_to_add(True)
    for query in (long[0], long[1], short[3], corpus(rng, 3000, "spaces")):
        ids, _ = _encode_pairs(truncating, base, query, [*long, *short[:5], query], max_length, side, True)
        whole_query = base.encode(query, add_special_tokens=False).ids
        for text, row in zip([*long, *short[:5], query], ids, strict=True):
            whole_text = base.encode(text, add_special_tokens=False).ids
            keep_q, keep_t = _pair_lengths(len(whole_query), len(whole_text), budget)
            kept_q = whole_query[:keep_q] if side == "right" else whole_query[len(whole_query) - keep_q :]
            kept_t = whole_text[:keep_t] if side == "right" else whole_text[len(whole_text) - keep_t :]
            assert len(row) == num_specials + len(kept_q) + len(kept_t) <= max_length
            plain = [
                t
                for t, special in zip(row.tolist(), special_mask(truncating, row), strict=True)
                if not special
            ]
            assert plain == kept_q + kept_t, (query[:30], text[:30])


def unbroken(rng: random.Random, num_chars: int, style: str) -> str:
    """Texts with no whitespace at all: what a window cannot cut at a space."""
    if style == "cjk-paragraph":  # one word to a Metaspace tokenizer, one per character to WordPiece
        return "".join(rng.choice("東京大学语义检索向量嵌入，。") for _ in range(num_chars))
    if style == "letters":  # one word to every family
        return ("abcdefghij" * (num_chars // 10 + 1))[:num_chars]
    if style == "blob":  # base64-like: letters, digits, + and /
        alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
        return "".join(rng.choice(alphabet) for _ in range(num_chars))
    return "".join(rng.choice(WORDS) for _ in range(num_chars // 6))[:num_chars]  # words run together


@pytest.mark.parametrize("family", ["wordpiece", "byte-level-bpe", "metaspace"])
@pytest.mark.parametrize("side", ["right", "left"])
def test_a_text_without_whitespace_is_cut_between_the_tokenizers_words_or_at_the_most(family, side):
    """No space to cut at: the window is cut between two of the words the tokenizer finds (WordPiece
    and byte-level BPE split letters, digits, punctuation and CJK apart), and the kept ids are those
    of the whole text; inside one word of 200,000 characters only at the most characters a window
    may have (WordPiece's [UNK] is the same; a BPE or Unigram model may segment the cut word
    differently). The characters tokenized stay within a few windows, not the text."""
    base = bert() if family == "wordpiece" else trained(family)
    rng = random.Random(f"unbroken-{family}-{side}")
    for max_length in (128, 512):
        truncating = truncating_tokenizer(base, max_length, side)
        for style in ("cjk-paragraph", "letters", "blob", "run-together"):
            text = unbroken(rng, 200_000, style)
            counting = CountingTokenizer(base)
            windowed = encode_ids_truncated(truncating, counting, [text], max_length, side)
            whole = truncating.encode(text).ids
            assert counting.num_chars < 4 * most_chars(max_length), (style, counting.num_chars)
            if family != "wordpiece" and len(set(base.encode(text[:5000]).word_ids) - {None}) == 1:
                # One word past the bound, cut inside: a BPE or Unigram model may segment it
                # differently from the whole text (the price of the bound); only the length holds.
                assert len(windowed[0]) == len(whole), (style, max_length)
            else:
                assert windowed[0].tolist() == whole, (style, max_length)


def special_mask(tokenizer: Tokenizer, row) -> list[bool]:
    """Which positions of an assembled pair hold the template's special tokens (by id)."""
    specials = {tokenizer.token_to_id(t) for t in ("[CLS]", "[SEP]", "<s>", "</s>", "<|endoftext|>")}
    return [token in specials - {None} for token in row.tolist()]


def test_untruncated_pairs_equal_the_whole_pair_and_an_over_long_side_is_refused_from_its_window():
    base = bert()
    texts = ["a short document", "another one, with more words in it", ""]
    ids, type_ids = _encode_pairs(base, base, "the query", texts, 128, "right", False)
    assert [row.tolist() for row in ids] == [base.encode("the query", t).ids for t in texts]
    assert [row.tolist() for row in type_ids] == [base.encode("the query", t).type_ids for t in texts]
    counting = CountingTokenizer(base)
    with pytest.raises(_OverLongPair) as refused:
        _encode_pairs(base, counting, "q", ["fine", "word " * 1_000_000], 128, "right", False)
    assert refused.value.index == 1
    assert counting.num_chars < 100_000  # 5 MB refused from a window of it


def test_a_long_query_is_tokenized_once_not_once_per_document():
    """The rerank amplification: a 100 KB query with 128 documents used to cost 128 tokenizations of
    the query (11.9 s, +470 MB); now the characters tokenized stay within a few windows of each."""
    base = bert()
    truncating = truncating_tokenizer(base, 256, "right")
    counting = CountingTokenizer(base)
    query = ("what is the best way to rank these documents " * 2300)[:100_000]
    documents = [f"document {i} about ranking and search" for i in range(128)]
    ids, _ = _encode_pairs(truncating, counting, query, documents, 256, "right", True)
    assert [row.tolist() for row in ids[:3]] == [truncating.encode(query, d).ids for d in documents[:3]]
    assert counting.num_chars < 3 * 256 * 8 + sum(len(d) for d in documents) * 2  # not 128 x 100 KB
