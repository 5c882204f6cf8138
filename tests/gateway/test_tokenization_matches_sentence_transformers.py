"""The gateway's token ids equal what sentence-transformers' default `encode` feeds the model."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import orjson
import pytest

from kembed.gateway.errors import InvalidInput, PayloadTooLarge
from kembed.gateway.tokenizing.tokenization import Tokenization
from kembed.proto.model_files import load_model_spec

VOCAB_SIZE = 30522
LONG_PROSE = "The quick brown fox jumps over the lazy dog, while 42 onlookers (mostly tourists!) cheer. " * 30
TEXTS = {
    "plain": "hello world",
    "padded-with-spaces": "   leading and trailing whitespace   ",
    "whitespace-only": " \t \n ",
    "empty": "",
    "emoji": "😀 emoji 🚀 and 👩‍👩‍👧 family",
    "cjk": "中文测试，日本語のテキスト，한국어 텍스트",
    "accents": "Ünïcödé àccents: café, naïve, Straße",
    "control-chars": "tabs\tand\nnew\r\nlines\x00nul",
    "over-256-tokens": LONG_PROSE,
    "over-256-repeated-word": "word " * 400,
}

Encoder = Callable[[str, str | None], list[int]]


def copy_model_dir(source: Path, target: Path, st_config: dict | None = None) -> Path:
    """A copy of `source`, weights linked, optionally with another config_sentence_transformers.json."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("model.safetensors"))
    (target / "model.safetensors").symlink_to(source / "model.safetensors")
    if st_config is not None:
        (target / "config_sentence_transformers.json").write_text(json.dumps(st_config))
    return target


@pytest.fixture(scope="module")
def prompted_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from gateway_fakes import BUNDLED_MODEL_DIR

    config = {"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": "passage"}
    return copy_model_dir(BUNDLED_MODEL_DIR, tmp_path_factory.mktemp("prompted") / "model", config)


class _Captured(Exception):
    """Raised from the hook once the ids are seen: the forward pass itself is not needed."""

    def __init__(self, ids: list[int]) -> None:
        super().__init__()
        self.ids = ids


def _capture(module: object, args: tuple) -> None:
    raise _Captured(args[0]["input_ids"][0].tolist())


def _sentence_transformers_encoder(model_dir: Path) -> Iterator[Encoder]:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir), device="cpu")
    # The ids the Transformer module receives are exactly what `encode` tokenized; one text per call
    # so no padding (and no length-sorting) is involved.
    handle = model[0].register_forward_pre_hook(_capture)

    def encode(text: str, prompt_name: str | None) -> list[int]:
        try:
            model.encode([text], prompt_name=prompt_name)
        except _Captured as captured:
            return captured.ids
        raise AssertionError("encode did not reach the Transformer module")

    yield encode
    handle.remove()


@pytest.fixture(scope="module")
def reference(request: pytest.FixtureRequest) -> Iterator[Encoder]:
    from gateway_fakes import BUNDLED_MODEL_DIR

    yield from _sentence_transformers_encoder(BUNDLED_MODEL_DIR)


@pytest.fixture(scope="module")
def prompted_reference(prompted_model_dir: Path) -> Iterator[Encoder]:
    yield from _sentence_transformers_encoder(prompted_model_dir)


@pytest.fixture
def tokenization(model_dir: Path) -> Iterator[Tokenization]:
    tokenization = Tokenization(load_model_spec(model_dir), num_threads=2)
    yield tokenization
    tokenization.close()


async def encode_one(tokenization: Tokenization, text: str, **options) -> list[int]:
    options = {"truncate": True, "direction": None, "prompt_name": None, "vocab_size": VOCAB_SIZE} | options
    (ids,) = await tokenization.encode([text], **options)
    return ids.tolist()


@pytest.mark.parametrize("text", TEXTS.values(), ids=TEXTS.keys())
async def test_ids_equal_sentence_transformers_encode(
    tokenization: Tokenization, reference: Encoder, text: str
):
    assert await encode_one(tokenization, text) == reference(text, None)


async def test_batch_keeps_input_order(tokenization: Tokenization, reference: Encoder):
    texts = list(TEXTS.values())
    encoded = await tokenization.encode(
        texts, truncate=True, direction=None, prompt_name=None, vocab_size=VOCAB_SIZE
    )
    assert [ids.tolist() for ids in encoded] == [reference(text, None) for text in texts]
    assert all(ids.dtype == np.int32 for ids in encoded)


def test_bundled_model_settings_follow_sentence_bert_config(model_dir: Path):
    spec = load_model_spec(model_dir)
    assert spec.max_seq_length == 256  # sentence_bert_config.json, not tokenizer.json's stored 128
    assert not spec.do_lower_case
    assert spec.prompts == {"query": "", "document": ""}
    assert spec.default_prompt_name is None


@pytest.mark.parametrize(
    "text", [LONG_PROSE, "word " * 400, "short text"], ids=["prose", "repeated", "short"]
)
async def test_left_truncation_equals_transformers_truncation_side_left(
    tokenization: Tokenization, model_dir: Path, text: str
):
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(str(model_dir), truncation_side="left")
    expected = reference(text, truncation=True, max_length=256)["input_ids"]
    assert await encode_one(tokenization, text, direction="left") == expected


@pytest.mark.parametrize(
    "prompt_name", [None, "query", "passage", "document"], ids=["default", "query", "passage", "document"]
)
@pytest.mark.parametrize("text", [TEXTS["plain"], TEXTS["over-256-tokens"]], ids=["short", "over-256"])
async def test_prompts_prepend_like_sentence_transformers(
    prompted_model_dir: Path, prompted_reference: Encoder, prompt_name: str | None, text: str
):
    tokenization = Tokenization(load_model_spec(prompted_model_dir), num_threads=1)
    try:
        assert await encode_one(tokenization, text, prompt_name=prompt_name) == prompted_reference(
            text, prompt_name
        )
    finally:
        tokenization.close()


async def test_unknown_prompt_name_is_rejected_listing_known_names(tokenization: Tokenization):
    with pytest.raises(InvalidInput, match=r"unknown prompt_name 'nope'.*'document', 'query'"):
        await encode_one(tokenization, "hi", prompt_name="nope")


async def test_untruncated_overlong_text_names_its_index_and_length(tokenization: Tokenization):
    with pytest.raises(
        PayloadTooLarge, match=r"input 1 has 40[0-9] tokens, more than the model's limit of 256"
    ):
        await tokenization.encode(
            ["fine", "word " * 400], truncate=False, direction=None, prompt_name=None, vocab_size=VOCAB_SIZE
        )


@pytest.mark.parametrize(
    ("direction", "expected"),
    [("right", list(range(1, 257))), ("left", list(range(45, 301)))],
    ids=["right", "left"],
)
async def test_token_id_inputs_are_taken_as_is_and_truncated(
    model_dir: Path, direction: str, expected: list[int]
):
    """With `--token-ids any`: any ids below the vocabulary size, cut to the limit as they are (the
    default's framing has tests of its own: test_token_id_framing.py)."""
    tokenization = Tokenization(load_model_spec(model_dir), num_threads=1, token_ids="any")
    (ids,) = await tokenization.encode(
        [list(range(1, 301))], truncate=True, direction=direction, prompt_name=None, vocab_size=VOCAB_SIZE
    )
    tokenization.close()
    assert ids.tolist() == expected


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ([], "input 0 is an empty list"),
        ([5, VOCAB_SIZE], f"token id {VOCAB_SIZE} outside"),
        ([-1], "token id -1"),
    ],
    ids=["empty", "past-vocab", "negative"],
)
async def test_bad_token_id_inputs_are_rejected(tokenization: Tokenization, ids: list[int], message: str):
    with pytest.raises(InvalidInput, match=message):
        await tokenization.encode(
            [ids], truncate=True, direction=None, prompt_name=None, vocab_size=VOCAB_SIZE
        )


async def test_untruncated_overlong_token_ids_are_too_large(tokenization: Tokenization):
    with pytest.raises(PayloadTooLarge, match="input 0 has 300 tokens"):
        await tokenization.encode(
            [[101, *range(1000, 1298), 102]], truncate=False, direction=None, prompt_name=None,
            vocab_size=VOCAB_SIZE,
        )  # fmt: skip


async def test_tokenize_reports_utf8_byte_offsets_into_the_text_as_tei_does(tokenization: Tokenization):
    text = "Hello wörld 😀"
    (tokens,) = orjson.loads(
        await tokenization.tokenize([text], add_special_tokens=True, prompt_name=None, max_tokens=100)
    )
    assert [t["text"] for t in tokens] == ["[CLS]", "Hello", "wörld", "😀", "[SEP]"]
    assert [t["special"] for t in tokens] == [True, False, False, False, True]
    # ö is 2 bytes, 😀 4: characters 6-11 are bytes 6-12, character 12 byte 13.
    assert tokens[2] == {"id": 2088, "text": "wörld", "special": False, "start": 6, "stop": 12}
    assert (tokens[3]["start"], tokens[3]["stop"]) == (13, 17)
    encoded = text.encode()
    for token in tokens[1:-1]:
        assert encoded[token["start"] : token["stop"]].decode() == token["text"]
    assert tokens[0]["start"] is None


@pytest.mark.parametrize("serial_max_chars", [0, 10**9], ids=["pool-batch", "one-by-one"])
async def test_both_encoding_paths_give_the_reference_ids_pairs_and_offsets(
    tokenization: Tokenization, reference: Encoder, serial_max_chars: int, monkeypatch: pytest.MonkeyPatch
):
    """A small batch is encoded text by text on the calling thread, a large one through the library's
    thread pool (encode_groups.SERIAL_MAX_CHARS): both give the same ids, pair ids and offsets."""
    from kembed.gateway.tokenizing import encode_groups

    monkeypatch.setattr(encode_groups, "SERIAL_MAX_CHARS", serial_max_chars)
    texts = list(TEXTS.values())
    encoded = await tokenization.encode(
        texts, truncate=True, direction=None, prompt_name=None, vocab_size=VOCAB_SIZE
    )
    assert [ids.tolist() for ids in encoded] == [reference(text, None) for text in texts]
    tokenizer = tokenization._tokenizer(True, None)
    ids, type_ids = await tokenization.encode_pairs("a query", texts, truncate=True, direction=None)
    expected = tokenizer.encode_batch([("a query", text) for text in texts])
    assert [row.tolist() for row in ids] == [e.ids for e in expected]
    assert [row.tolist() for row in type_ids] == [e.type_ids for e in expected]
    (tokens,) = orjson.loads(
        await tokenization.tokenize(
            ["Hello wörld 😀"], add_special_tokens=False, prompt_name=None, max_tokens=100
        )
    )
    assert [(t["text"], t["start"], t["stop"]) for t in tokens] == [
        ("Hello", 0, 5),
        ("wörld", 6, 12),  # UTF-8 bytes
        ("😀", 13, 17),
    ]


@pytest.mark.parametrize("truncate", [True, False], ids=["truncated", "whole"])
async def test_bulk_processes_ids_equal_sentence_transformers_encode(
    model_dir: Path, reference: Encoder, truncate: bool
):
    """A bulk request's texts, tokenized in the bulk processes, get the ids the threads give, which
    are sentence-transformers' (without truncation the over-long texts are left out: refused)."""
    texts = [text for name, text in TEXTS.items() if truncate or not name.startswith("over-")] * 4
    pooled = Tokenization(load_model_spec(model_dir), 1, max_inline_chars=64, num_bulk_processes=1)
    try:
        encoded = await pooled.encode(
            texts, truncate=truncate, direction=None, prompt_name=None, vocab_size=VOCAB_SIZE, is_bulk=True
        )
        assert pooled.num_bulk_in_processes == 1
    finally:
        pooled.close()
    assert [ids.tolist() for ids in encoded] == [reference(text, None) for text in texts]
    assert all(ids.dtype == np.int32 for ids in encoded)
