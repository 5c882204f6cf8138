"""A multi-task model's task adapters on the wire: a RequestFrame's per-request `tasks` and an
EmbedRequest's `task` become each token's task (the token type ids jina_v3.py reads), whatever token
types the wire carried; a task the model lacks fails naming its tasks."""

import dataclasses
import re

import numpy as np
import pytest

from kembed.proto import embedder_pb2 as pb
from kembed.worker.edge.frame_decoding import frame_tasks
from kembed.worker.edge.server import task_types
from kembed.worker.errors import InvalidInput
from kembed.worker.info import ModelInfo

PLAIN = ModelInfo(
    model_name="m", model_type="xlm-roberta", task="embed", dimensions=8, max_sequence_length=64,
    vocab_size=100, pooling="mean", normalize=True, dtype="float32", device="cpu", attention_backend="sdpa",
)  # fmt: skip
TASKED = dataclasses.replace(PLAIN, tasks=("retrieval.query", "retrieval.passage"), default_task="")
NUM_SEQUENCES, LENGTHS = np.array([2, 1], np.uint32), np.array([3, 1, 2], np.uint32)


def frame(tasks: list[int] | None) -> pb.RequestFrame:
    message = pb.RequestFrame(token_type_ids=np.ones(6, "<i4").tobytes())  # a pair's types: never tasks
    if tasks is not None:
        message.tasks = np.array(tasks, "u1").tobytes()
    return message


def test_each_requests_task_reaches_each_of_its_tokens():
    types = frame_tasks(frame([2, 1]), NUM_SEQUENCES, LENGTHS, TASKED)
    assert types is not None and types.tolist() == [2, 2, 2, 2, 1, 1]
    absent = frame_tasks(frame(None), NUM_SEQUENCES, LENGTHS, TASKED)
    assert absent is not None and absent.tolist() == [0] * 6  # the default, not the wire's type ids


def test_a_model_without_tasks_keeps_the_wire_and_refuses_a_task():
    assert frame_tasks(frame(None), NUM_SEQUENCES, LENGTHS, PLAIN) is None
    assert frame_tasks(frame([0, 0]), NUM_SEQUENCES, LENGTHS, PLAIN) is None
    with pytest.raises(InvalidInput, match="has no task adapters"):
        frame_tasks(frame([0, 1]), NUM_SEQUENCES, LENGTHS, PLAIN)


@pytest.mark.parametrize(
    ("tasks", "problem"),
    [
        ([3, 0], "names task 3; model m has 2: retrieval.query, retrieval.passage"),
        ([1], "1 values for 2 requests"),
    ],
)
def test_a_task_past_the_models_or_a_short_array_fails_the_frame(tasks, problem):
    with pytest.raises(InvalidInput, match=re.escape(problem)):
        frame_tasks(frame(tasks), NUM_SEQUENCES, LENGTHS, TASKED)


def test_an_embed_requests_task_by_name():
    assert task_types("retrieval.passage", LENGTHS, TASKED).tolist() == [2] * 6
    assert task_types("", LENGTHS, TASKED).tolist() == [0] * 6
    assert task_types("", LENGTHS, PLAIN) is None
    with pytest.raises(
        InvalidInput, match=re.escape("not one of model m's: retrieval.query, retrieval.passage")
    ):
        task_types("separation", LENGTHS, TASKED)
    with pytest.raises(InvalidInput, match="has no task adapters"):
        task_types("retrieval.query", LENGTHS, PLAIN)
