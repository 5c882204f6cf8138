"""The committed gRPC stubs are what `make proto` generates from embedder.proto today."""

from pathlib import Path

from kembed.proto import generate


def test_committed_stubs_match_a_fresh_generation(tmp_path):
    fresh = generate.generate(tmp_path)
    committed = Path(generate.__file__).parent
    stale = [p.name for p in fresh if p.read_text() != (committed / p.name).read_text()]
    assert not stale, f"stale stubs {stale}: run `make proto` and commit the result"


def test_the_contract_keeps_bulk_data_as_packed_bytes():
    from kembed.proto import embedder_pb2 as pb

    fields = pb.TokenBatch.DESCRIPTOR.fields_by_name
    assert fields["token_ids"].type == fields["token_ids"].TYPE_BYTES
    assert pb.EmbedResponse.DESCRIPTOR.fields_by_name["embeddings"].type == fields["token_ids"].TYPE_BYTES
    assert pb.DESCRIPTOR.package == "kembed.v1"
