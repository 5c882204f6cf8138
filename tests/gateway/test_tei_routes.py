"""TEI's root route, /similarity, /decode and /info's TEI fields, over fake workers (the e2e test
drives them with huggingface_hub's InferenceClient against the real model)."""

import numpy as np
from gateway_fakes import FakeEmbedder, fake_vector
from test_rerank_routes import RecordingScorer


async def test_the_root_route_reranks_on_a_cross_encoder_and_info_has_tei_reranker_fields(gateway_with):
    scorer = RecordingScorer()
    async with gateway_with(scorer) as client:
        ranked = await client.post("/", json={"query": "q", "texts": ["a b", "c", "d e f"]})
        direct = await client.post("/rerank", json={"query": "q", "texts": ["a b", "c", "d e f"]})
        info = (await client.get("/info")).json()
    assert ranked.status_code == 200 and ranked.json() == direct.json()
    assert info["model_type"] == {"reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}}
    assert info["served_model_name"] == "fake-minilm" and info["auto_truncate"] is True


async def test_similarity_is_the_cosine_of_the_source_to_each_sentence(gateway_with):
    body = {"inputs": {"source_sentence": "a query", "sentences": ["one text", "another text", "a query"]}}
    async with gateway_with(FakeEmbedder()) as client:
        direct = await client.post("/similarity", json=body)
        rooted = await client.post("/", json=body)
        vectors = np.asarray((await client.post("/embed", json={"inputs": ["a query", "one text"]})).json())
        empty = await client.post("/similarity", json={"inputs": {"source_sentence": "q", "sentences": []}})
    assert direct.status_code == 200 and direct.json() == rooted.json()
    got = direct.json()
    assert len(got) == 3 and abs(got[2] - 1.0) < 1e-6
    assert abs(got[0] - float(vectors[0] @ vectors[1])) < 1e-5  # /embed vectors are unit vectors
    assert empty.status_code == 422 and "sentences" in empty.json()["error"]
    assert fake_vector  # the fake's vectors depend on the ids: the cosines above are not all 1


async def test_decode_refuses_ids_outside_the_vocabulary(gateway_with):
    async with gateway_with(FakeEmbedder()) as client:
        good = await client.post("/decode", json={"ids": [101, 7592, 102]})
        bad = await client.post("/decode", json={"ids": [[101], [-1]]})
        empty = await client.post("/decode", json={"ids": []})
    assert good.json() == ["hello"]
    assert bad.status_code == 422 and "ids 1 has token id -1" in bad.json()["error"]
    assert empty.status_code == 200 and empty.json() == [""]
