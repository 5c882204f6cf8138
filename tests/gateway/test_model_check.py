"""The gateway's check of a replica's Info against its own model (gateway/pool/model_check.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kembed.gateway.pool.model_check import ModelCheck
from kembed.proto import embedder_pb2 as pb
from kembed.proto.model_identity import ModelIdentity

TOKENIZER, OTHER_TOKENIZER = "sha256:" + "a" * 64, "sha256:" + "b" * 64
MODEL, OTHER_MODEL = "sha256:" + "c" * 64, "sha256:" + "d" * 64


def info(**fields) -> pb.InfoResponse:
    defaults = dict(
        task="embed", dimensions=384, pooling="mean", normalize=True, outputs=1,
        tokenizer_digest=TOKENIZER, model_digest=MODEL,
    )  # fmt: skip
    return pb.InfoResponse(**(defaults | fields))


WITH_WEIGHTS = ModelCheck(ModelIdentity(TOKENIZER, MODEL), Path("/m"))
WITHOUT_WEIGHTS = ModelCheck(ModelIdentity(TOKENIZER, ""), Path("/m"))


@pytest.mark.parametrize(
    ("check", "replica", "serving", "refused_for"),
    [
        (WITH_WEIGHTS, info(), [], ""),
        (WITH_WEIGHTS, info(tokenizer_digest=OTHER_TOKENIZER), [], "its tokenizer"),
        (WITHOUT_WEIGHTS, info(tokenizer_digest=OTHER_TOKENIZER), [], "its tokenizer"),
        (WITH_WEIGHTS, info(model_digest=OTHER_MODEL), [], "its weights and configs"),
        (WITHOUT_WEIGHTS, info(model_digest=OTHER_MODEL), [], ""),
        (WITHOUT_WEIGHTS, info(model_digest=OTHER_MODEL), [info()], "other weights than the replicas"),
        (WITH_WEIGHTS, info(pooling="cls"), [info()], "answers unlike the replicas serving"),
        (WITH_WEIGHTS, info(normalize=False), [info()], "answers unlike"),
        (WITH_WEIGHTS, info(task="score"), [info()], "answers unlike"),
        (WITH_WEIGHTS, info(tokenizer_digest="", model_digest=""), [], ""),
        (WITH_WEIGHTS, info(tokenizer_digest="", model_digest=""), [info()], ""),
    ],
    ids=[
        "same-model", "other-tokenizer", "other-tokenizer-no-weights-here", "other-weights",
        "first-of-unknown-weights", "other-weights-than-serving", "other-pooling", "not-normalised",
        "another-task", "older-worker-alone", "older-worker-beside-one",
    ],
)  # fmt: skip
def test_a_replica_is_refused_exactly_when_it_serves_another_model(check, replica, serving, refused_for):
    refusal = check.refusal(replica, serving)
    if refused_for:
        assert refused_for in refusal, refusal
    else:
        assert refusal == ""


def test_a_replica_without_digests_is_unchecked_not_refused():
    assert WITH_WEIGHTS.is_unchecked(info(tokenizer_digest=""))
    assert WITH_WEIGHTS.is_unchecked(info(model_digest=""))
    assert not WITHOUT_WEIGHTS.is_unchecked(info(model_digest=""))
    assert not WITH_WEIGHTS.is_unchecked(info())
