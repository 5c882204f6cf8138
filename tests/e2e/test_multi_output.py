"""Several outputs a text through a real gateway and worker: BGE-M3's dense, sparse and ColBERT in
one `/v1/embeddings` request against FlagEmbedding's computation, TEI's `/embed_sparse`, `/embed_all`
against sentence-transformers' `token_embeddings` on the bundled model, and what is refused."""

import base64
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
from processes import start_stack
from schemathesis import GenerationMode
from test_openapi import run_operations

from kembed.proto.outputs import DENSE

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "worker"))
from m3_model import build_m3_dir, m3_reference

TEXTS = ["w1 w2 w3 w2", "w7", "w5 w9 w11 w13 w15 w17 w19 w21 nothere w5"]


@pytest.fixture(scope="module")
def m3_dir(tmp_path_factory):
    return build_m3_dir(tmp_path_factory.mktemp("m3") / "tiny-m3")


@pytest.fixture(scope="module")
def m3_stack(log_dir, m3_dir):
    started = start_stack(log_dir, num_workers=1, model_dir=m3_dir, worker_model_dir=m3_dir)
    yield started
    for proc in started.processes:
        proc.stop()


def _ids(m3_dir: Path, texts: list[str]) -> list[list[int]]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(m3_dir / "tokenizer.json"))
    return [e.ids for e in tokenizer.encode_batch(texts)]


def _cos(a, b) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def test_one_request_gets_dense_sparse_and_colbert_as_flagembedding(m3_stack, m3_dir):
    reference = m3_reference(m3_dir, _ids(m3_dir, TEXTS))
    body = {"input": TEXTS, "outputs": ["dense", "sparse", "colbert"]}
    answer = httpx.post(f"{m3_stack.url}/v1/embeddings", json=body, timeout=60).json()
    for item, ref in zip(answer["data"], reference, strict=True):
        assert _cos(item["embedding"], ref["dense"]) >= 0.999
        colbert = np.array(item["colbert_embedding"])
        assert colbert.shape == ref["colbert"].shape and _cos(colbert, ref["colbert"]).min() >= 0.999
        sparse = item["sparse_embedding"]
        assert sparse["indices"] == sorted(ref["sparse"]) and sparse["indices"] == sorted(
            set(sparse["indices"])
        )
        assert (
            np.abs(np.array(sparse["values"]) - [ref["sparse"][i] for i in sparse["indices"]]).max() <= 1e-3
        )
    assert answer["usage"]["prompt_tokens"] == sum(len(ids) for ids in _ids(m3_dir, TEXTS))


def test_colbert_vectors_come_in_the_dense_encodings(m3_stack):
    def colbert(encoding: str) -> list:
        body = {"input": TEXTS[:1], "outputs": ["colbert"], "encoding_format": encoding}
        answer = httpx.post(f"{m3_stack.url}/v1/embeddings", json=body, timeout=60).json()
        assert "embedding" not in answer["data"][0]
        return answer["data"][0]["colbert_embedding"]

    floats = np.array(colbert("float"), np.float32)
    decoded = np.stack([np.frombuffer(base64.b64decode(v), "<f4") for v in colbert("base64")])
    assert np.array_equal(decoded, floats)
    bits = np.stack([np.frombuffer(base64.b64decode(v), np.uint8) for v in colbert("base64_binary")])
    assert np.array_equal(np.unpackbits(bits, axis=1, bitorder="little")[:, : floats.shape[1]], floats > 0)
    int8 = np.stack([np.frombuffer(base64.b64decode(v), np.int8) for v in colbert("base64_int8")])
    assert int8.shape == floats.shape and _cos(int8, floats).min() >= 0.99


def test_embed_sparse_answers_tei_shape(m3_stack, m3_dir):
    reference = m3_reference(m3_dir, _ids(m3_dir, TEXTS))
    answer = httpx.post(f"{m3_stack.url}/embed_sparse", json={"inputs": TEXTS}, timeout=60).json()
    for entries, ref in zip(answer, reference, strict=True):
        assert {e["index"] for e in entries} == set(ref["sparse"])
        assert all(abs(e["value"] - ref["sparse"][e["index"]]) <= 1e-3 for e in entries)


def test_info_says_which_outputs_the_model_has(m3_stack, stack):
    assert httpx.get(f"{m3_stack.url}/info").json()["outputs"] == ["dense", "sparse", "colbert", "tokens"]
    assert httpx.get(f"{stack.url}/info").json()["outputs"] == ["dense", "tokens"]
    document = httpx.get(f"{m3_stack.url}/openapi.json").json()
    assert "/embed_sparse" in document["paths"]
    outputs = document["components"]["schemas"]["EmbeddingRequest"]["properties"]["outputs"]
    listed = next(branch for branch in outputs["anyOf"] if branch.get("type") == "array")
    assert listed["items"]["enum"] == ["dense", "sparse", "colbert"]
    paths = httpx.get(f"{stack.url}/openapi.json").json()["paths"]
    assert "/embed_sparse" not in paths and "/embed_all" in paths


@pytest.mark.parametrize(
    ("path", "body", "status", "has"),
    [
        ("/v1/embeddings", {"input": ["a"], "outputs": ["sparse"]}, 400, "it has: dense"),
        ("/v1/embeddings", {"input": ["a"], "outputs": ["dense", "colbert"]}, 400, "it has: dense"),
        # TEI's status for a request it cannot validate; its outputs named by the routes serving them
        ("/embed_sparse", {"inputs": ["a"]}, 422, "it has: dense (/embed), token vectors (/embed_all)"),
    ],
    ids=["sparse", "colbert", "embed-sparse"],
)
def test_an_output_the_model_lacks_is_refused_naming_what_it_has(stack, path, body, status, has):
    """Only what the route takes is named: `outputs` takes dense, sparse, colbert, never `tokens`
    (before, the OpenAI route's error said "it has: dense, tokens")."""
    response = httpx.post(f"{stack.url}{path}", json=body, timeout=30)
    assert response.status_code == status, response.text
    said = response.json()["error"]
    said = said["message"] if isinstance(said, dict) else said
    assert said.endswith(has), said


def _batches(stack) -> float:
    """Batches the stack's workers have run (their kembed_worker_batch_tokens count)."""
    total = 0.0
    for port in stack.worker_metrics_ports:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        total += sum(
            float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith("kembed_worker_batch_tokens_count")
        )
    return total


def test_dimensions_cuts_colbert_vectors_as_flagembeddings_truncate_dim(m3_stack, m3_dir):
    """FlagEmbedding's `truncate_dim` cuts the dense and the ColBERT vectors, then normalises both;
    before, kembed cut the dense one only."""
    reference = m3_reference(m3_dir, _ids(m3_dir, TEXTS))
    body = {"input": TEXTS, "outputs": ["dense", "colbert"], "dimensions": 8}
    answer = httpx.post(f"{m3_stack.url}/v1/embeddings", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    for item, ref in zip(answer.json()["data"], reference, strict=True):
        dense, colbert = np.array(item["embedding"]), np.array(item["colbert_embedding"])
        assert dense.shape == (8,) and colbert.shape == (ref["colbert"].shape[0], 8)
        assert _cos(dense, ref["dense"][:8]) >= 0.999
        assert _cos(colbert, ref["colbert"][:, :8]).min() >= 0.999
        np.testing.assert_allclose(np.linalg.norm(colbert, axis=1), 1.0, rtol=1e-4)


def test_dimensions_out_of_range_with_outputs_is_refused_before_the_model_runs(m3_stack):
    before = _batches(m3_stack)
    body = {"input": TEXTS, "outputs": ["colbert"], "dimensions": 33}  # the tiny model has 32
    answer = httpx.post(f"{m3_stack.url}/v1/embeddings", json=body, timeout=60)
    assert answer.status_code == 400 and "dimensions must be between 1 and 32" in answer.text
    assert _batches(m3_stack) == before  # refused before a worker ran it (before: after it had)


@pytest.fixture(scope="module")
def capped_m3_gateway(m3_stack, log_dir, m3_dir):
    """A second gateway over the same worker, its answers capped at 100,000 bytes."""
    started = start_stack(
        log_dir, num_workers=0, model_dir=m3_dir, worker_addresses=m3_stack.workers,
        gateway_args=("--max-answer-bytes", "100000"),
    )  # fmt: skip
    yield started
    for proc in started.processes:
        proc.stop()


LONG_TEXTS = [" ".join(f"w{(i * 7 + j) % 120}" for j in range(100)) for i in range(64)]


def test_a_colbert_answer_past_the_cap_is_a_413_before_the_model_runs(m3_stack, capped_m3_gateway):
    """64 inputs of 100 words (102 tokens) as ColBERT float vectors: ~770 KB of JSON on the tiny
    model's 32 dimensions (BGE-M3's 1024 make it 32 times that). Refused by the capped gateway
    with an estimate at least the answer's real size, and not far above it; before the worker
    ran it. The same request is answered under the default cap."""
    body = {"input": LONG_TEXTS, "outputs": ["colbert"]}
    answered = httpx.post(f"{m3_stack.url}/v1/embeddings", json=body, timeout=60)
    assert answered.status_code == 200
    size = len(answered.content)
    before = _batches(m3_stack)
    refused = httpx.post(f"{capped_m3_gateway.url}/v1/embeddings", json=body, timeout=60)
    assert refused.status_code == 413, refused.text
    message = refused.json()["error"]["message"]
    assert "more than the limit of 100,000 (--max-answer-bytes)" in message and "base64" in message
    estimate = int(message.split("about ")[1].split(" bytes")[0].replace(",", ""))
    assert size <= estimate <= 1.3 * size, (size, estimate)
    assert _batches(m3_stack) == before
    as_bits = httpx.post(
        f"{capped_m3_gateway.url}/v1/embeddings", json=body | {"encoding_format": "base64_binary"}, timeout=60
    )
    assert as_bits.status_code == 200 and len(as_bits.content) <= 100_000


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/embed", {"inputs": ["w1"] * 400}),  # 400 dense vectors of 32 floats: ~170 KB
        ("/embed_all", {"inputs": LONG_TEXTS[:8]}),  # 816 token vectors of 32 floats: ~340 KB
        ("/embed_sparse", {"inputs": LONG_TEXTS * 2}),  # up to 13,056 entries
    ],
    ids=["dense", "token-vectors", "sparse"],
)
def test_every_answer_is_capped(capped_m3_gateway, path, body):
    refused = httpx.post(f"{capped_m3_gateway.url}{path}", json=body, timeout=60)
    assert refused.status_code == 413 and "--max-answer-bytes" in refused.json()["error"], refused.text


@pytest.mark.parametrize(
    "outputs", [[], ["dense", "lexical"], "dense", [1]], ids=["empty", "unknown", "not-a-list", "number"]
)
def test_a_bad_outputs_field_is_a_4xx(stack, outputs):
    response = httpx.post(f"{stack.url}/v1/embeddings", json={"input": ["a"], "outputs": outputs}, timeout=30)
    assert 400 <= response.status_code < 500 and "outputs" in response.text


def test_embed_all_matches_sentence_transformers_token_embeddings(stack, reference):
    texts = ["A short one.", "Every token of this somewhat longer sentence gets its own vector."]
    answer = httpx.post(f"{stack.url}/embed_all", json={"inputs": texts}, timeout=60).json()
    tokens = reference.encode(texts, output_value="token_embeddings", convert_to_numpy=False)
    for got, want in zip(answer, tokens, strict=True):
        want = want.numpy()
        assert np.array(got).shape == want.shape
        assert _cos(got, want).min() >= 0.999


def test_a_text_in_the_input_naming_outputs_takes_the_dense_path(stack):
    body = {"input": ['say "outputs" here']}
    answer = httpx.post(f"{stack.url}/v1/embeddings", json=body, timeout=30).json()
    assert len(answer["data"][0]["embedding"]) == 384 and DENSE == 1


def test_schemathesis_takes_every_valid_request_for_several_outputs(m3_stack):
    answered = run_operations(
        m3_stack.url, GenerationMode.POSITIVE, set(), also=frozenset({"POST /v1/embeddings"})
    )
    assert answered["POST /v1/embeddings"][1] > 0


@pytest.fixture(scope="module")
def bare_m3_stack(log_dir, tmp_path_factory, m3_dir):
    """The tiny BGE-M3 directory with a tokenizer_config.json that names its class but none of its
    special tokens (and no special_tokens_map.json), as some exports ship it; its own worker."""
    import json
    import shutil

    path = tmp_path_factory.mktemp("bare-m3") / "tiny-m3"
    shutil.copytree(m3_dir, path)
    (path / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "XLMRobertaTokenizerFast", "model_max_length": 128})
    )
    started = start_stack(log_dir, num_workers=1, model_dir=path, worker_model_dir=path)
    yield started, path
    for proc in started.processes:
        proc.stop()


def test_special_tokens_the_files_do_not_name_are_skipped_as_the_tokenizer_class_has_them(bare_m3_stack):
    """FlagEmbedding skips the cls, eos, pad and unk tokens of `AutoTokenizer`'s tokenizer, whose
    special_tokens_map is then XLMRobertaTokenizer's defaults; before, kembed skipped none and the
    sparse vectors kept <s>, </s> and <unk>."""
    import inspect

    import transformers
    from tokenizers import Tokenizer

    stack, path = bare_m3_stack
    defaults = inspect.signature(transformers.XLMRobertaTokenizer.__init__).parameters
    vocab = Tokenizer.from_file(str(path / "tokenizer.json")).get_vocab()
    skipped = {vocab[defaults[name].default] for name in ("cls_token", "eos_token", "pad_token", "unk_token")}
    assert skipped == {0, 1, 2, 3}  # <s>, <pad>, </s>, <unk>: m3_reference's `unused`
    reference = m3_reference(path, _ids(path, TEXTS))
    answer = httpx.post(f"{stack.url}/embed_sparse", json={"inputs": TEXTS}, timeout=60).json()
    for entries, ref in zip(answer, reference, strict=True):
        assert {e["index"] for e in entries} == set(ref["sparse"])
        assert not {e["index"] for e in entries} & skipped
    assert 3 in _ids(path, TEXTS)[2]  # "nothere" is <unk>: a token the answer had, before
