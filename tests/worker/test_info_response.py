"""The worker's Info answer carries every ModelInfo field by name: a field added to ModelInfo or to
InfoResponse alone (neither the model's nor the server's) fails here, not silently as a zero."""

import dataclasses

from kembed.proto import embedder_pb2 as pb
from kembed.worker.edge.server import SERVING_FIELDS, info_response
from kembed.worker.info import ModelInfo

INFO = ModelInfo(
    model_name="m",
    model_type="bert",
    task="embed",
    dimensions=384,
    max_sequence_length=512,
    vocab_size=30522,
    pooling="mean",
    normalize=True,
    dtype="float32",
    device="cpu",
    attention_backend="sdpa",
    outputs=1,
    colbert_dimensions=7,
    hidden_size=384,
    tasks=("retrieval.query", "retrieval.passage"),
    default_task="retrieval.passage",
)


def test_info_response_fields_are_model_info_fields_and_serving_fields() -> None:
    message_fields = {f.name for f in pb.InfoResponse.DESCRIPTOR.fields}
    model_fields = {f.name for f in dataclasses.fields(ModelInfo)}
    assert model_fields.isdisjoint(SERVING_FIELDS)
    assert message_fields == model_fields | SERVING_FIELDS


def test_info_response_copies_every_model_info_field() -> None:
    response = info_response(INFO, max_batch_tokens=512, revision="r1", version="9")
    copied = {name: getattr(response, name) for name in dataclasses.asdict(INFO)}
    copied["tasks"] = tuple(copied["tasks"])  # a repeated field
    assert copied == dataclasses.asdict(INFO)
    assert (response.max_batch_tokens, response.revision, response.version) == (512, "r1", "9")
