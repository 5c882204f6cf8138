"""The span-pooling fields of TokenBatch: they survive the wire (gRPC and data-port frames carry the
same bytes), and a batch without them reads as it did before they existed."""

import numpy as np

from kembed.gateway.pool.batches import num_rows, pack
from kembed.proto import embedder_pb2 as pb


def test_spans_round_trip_through_serialization():
    ids = [np.arange(1, 7, dtype=np.int32), np.arange(1, 4, dtype=np.int32), np.arange(1, 5, dtype=np.int32)]
    spans = [np.array([1, 3, 5]), None, np.array([0, 4])]
    request = pb.EmbedRequest(batch=pack(ids, None, spans), request_id="r")
    parsed = pb.EmbedRequest.FromString(request.SerializeToString())
    assert list(parsed.batch.num_spans) == [2, 0, 1]
    assert list(parsed.batch.span_bounds) == [1, 3, 5, 0, 4]
    assert list(parsed.batch.lengths) == [6, 3, 4]
    assert num_rows(spans) == 4


def test_a_batch_without_spans_has_none_on_the_wire():
    batch = pack([np.arange(1, 4, dtype=np.int32)])
    assert not batch.num_spans and not batch.span_bounds
    old = pb.TokenBatch(token_ids=batch.token_ids, lengths=batch.lengths).SerializeToString()
    assert batch.SerializeToString() == old  # unchanged bytes for every existing caller
