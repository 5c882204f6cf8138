"""Token-id inputs by default (`--token-ids framed`): only ids this model's tokenizer makes are embedded.
A BERT tokenizer frames a sequence as [CLS] ... [SEP]; ids without that frame are another
tokenizer's, most often tiktoken's (langchain-openai's OpenAIEmbeddings sends them unless told
otherwise), and were embedded as wrong vectors (cosine 0.015 for "The cat sits on the mat.") when
every id happened to fall below the vocabulary size. A tokenizer that frames nothing is held to a
round trip instead: its own ids decode and encode back to themselves."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from gateway_fakes import BUNDLED_MODEL_DIR
from tokenizers import Tokenizer

from kembed.gateway.errors import InvalidInput
from kembed.gateway.tokenizing.tokenization import Tokenization
from kembed.proto.model_files import load_model_spec

VOCAB_SIZE = 30522
TEXT = "The cat sits on the mat."
TIKTOKEN_IDS = [791, 8415, 23874, 389, 279, 5634, 13]  # cl100k_base's ids of TEXT, all below 30,522
LONG = " ".join(f"word{i}" for i in range(400))


async def encode(tokenization: Tokenization, item, **options):
    options = {"truncate": True, "direction": None, "prompt_name": None, "vocab_size": VOCAB_SIZE} | options
    (ids,) = await tokenization.encode([item], **options)
    return ids.tolist()


@pytest.fixture
def framed():
    tokenization = Tokenization(load_model_spec(BUNDLED_MODEL_DIR), num_threads=1)
    yield tokenization
    tokenization.close()


@pytest.fixture
def tokenizer() -> Tokenizer:
    tokenizer = Tokenizer.from_file(str(BUNDLED_MODEL_DIR / "tokenizer.json"))
    tokenizer.no_truncation()  # the file's own setting cuts at 128
    tokenizer.no_padding()
    return tokenizer


async def test_this_models_own_ids_are_embedded_as_its_text(framed, tokenizer):
    own = tokenizer.encode(TEXT).ids
    assert own[0] == 101 and own[-1] == 102
    assert await encode(framed, own) == await encode(framed, TEXT) == own


@pytest.mark.parametrize("direction", ["right", "left"], ids=["right", "left"])
async def test_over_long_own_ids_are_cut_inside_their_frame_as_the_text_is(framed, tokenizer, direction):
    own = tokenizer.encode(LONG).ids  # untruncated: 800-odd ids
    assert len(own) > 256
    cut = await encode(framed, own, direction=direction)
    assert cut == await encode(framed, LONG, direction=direction)
    assert len(cut) == 256 and cut[0] == 101 and cut[-1] == 102


@pytest.mark.parametrize(
    "ids",
    [TIKTOKEN_IDS, [101, *TIKTOKEN_IDS], [*TIKTOKEN_IDS, 102], [101]],
    ids=["tiktoken", "no-sep", "no-cls", "cls-alone"],
)
async def test_ids_without_the_tokenizers_frame_are_refused_naming_the_setting(framed, ids):
    with pytest.raises(InvalidInput) as refused:
        await encode(framed, ids)
    message = str(refused.value)
    assert "input 0's token ids were not made by this model's tokenizer" in message
    assert "[CLS] (101) ... [SEP] (102)" in message
    assert "check_embedding_ctx_length=False" in message and "--token-ids any" in message
    assert refused.value.param == "input"


async def test_any_takes_every_id_below_the_vocabulary_as_it_is():
    tokenization = Tokenization(load_model_spec(BUNDLED_MODEL_DIR), num_threads=1, token_ids="any")
    try:
        assert await encode(tokenization, TIKTOKEN_IDS) == TIKTOKEN_IDS
        assert await encode(tokenization, list(range(1, 301))) == list(range(1, 257))
    finally:
        tokenization.close()


@pytest.fixture
def unframed_dir(tmp_path: Path) -> Path:
    """The bundled model whose tokenizer adds no special tokens (a GPT-style post-processor)."""
    target = tmp_path / "unframed"
    shutil.copytree(BUNDLED_MODEL_DIR, target)
    tokenizer = json.loads((target / "tokenizer.json").read_text())
    tokenizer["post_processor"] = None
    (target / "tokenizer.json").write_text(json.dumps(tokenizer))
    return target


async def test_a_tokenizer_that_frames_nothing_takes_ids_that_round_trip(unframed_dir):
    tokenization = Tokenization(load_model_spec(unframed_dir), num_threads=1)
    try:
        own = Tokenizer.from_file(str(unframed_dir / "tokenizer.json")).encode(TEXT).ids
        assert 101 not in own
        assert await encode(tokenization, own) == own
        with pytest.raises(InvalidInput, match="do not decode and encode back to themselves"):
            await encode(tokenization, TIKTOKEN_IDS)
    finally:
        tokenization.close()
