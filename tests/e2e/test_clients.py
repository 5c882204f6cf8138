"""docs/clients.md, run: every snippet marked `<!-- test: NAME -->` executed as written, its URL (and
the reranker's name) swapped for a real gateway's over real worker processes, with the real client
libraries; its vectors checked against sentence-transformers' on the same model directory, its
scores against the cross-encoder's. The page's claims about what goes wrong otherwise are checked too.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from processes import MODEL_NAME

DOC = Path(__file__).parents[2] / "docs" / "clients.md"
DOC_URL = "http://127.0.0.1:8080"
DOC_RERANKER = "my-reranker"
NODE_DIR = Path(__file__).parents[1] / "clients" / "node"  # package.json: the Node openai client

SNIPPETS = {
    name: (language, code)
    for name, language, code in re.findall(
        r"<!-- test: ([\w-]+) -->\n```(\w+)\n(.*?)\n```", DOC.read_text(), re.S
    )
}
# Each embedding snippet and the vector size it asks for.
EMBEDDING_SNIPPETS = {
    "openai-python": 128,
    "langchain-openai": 384,
    "llama-index": 384,
    "litellm-openai": 128,
    "litellm-cohere": 384,
    "cohere-v2": 384,
    "cohere-v1": 384,
    "huggingface-hub": 384,
}


# Runs a snippet as a script (its own process: its clients, sockets and environment end with it) and
# prints the values of the expressions named after it, evaluated among the script's variables.
RUNNER = """
import json, runpy, sys
variables = runpy.run_path(sys.argv[1], run_name="__main__")
values = {expression: eval(expression, variables) for expression in sys.argv[2:]}
print(json.dumps(values, default=lambda value: value.tolist()))
"""


def run_python(name: str, url: str, tmp_path: Path, *expressions: str, reranker: str | None = None) -> dict:
    """The snippet run as written but for its URL (and reranker name); `expressions` of its variables."""
    language, code = SNIPPETS[name]
    assert language == "python"
    code = code.replace(DOC_URL, url)
    if reranker is not None:
        code = code.replace(f'"{DOC_RERANKER}"', json.dumps(reranker))
    script = tmp_path / f"{name.replace('-', '_')}.py"
    script.write_text(code)
    done = subprocess.run(
        [sys.executable, "-P", "-c", RUNNER, str(script), *expressions],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, f"{DOC.name}'s {name} snippet failed:\n{done.stderr}"
    return json.loads(done.stdout.splitlines()[-1])


def assert_sentence_transformers_vectors(reference, texts, vectors) -> None:
    got = np.asarray(vectors, dtype=np.float32)
    expected = reference.encode(texts, truncate_dim=got.shape[1])
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)  # kembed renormalises after truncation
    assert got.shape == (len(texts), expected.shape[1])
    cosines = (got * expected).sum(1) / np.linalg.norm(got, axis=1)
    assert cosines.min() >= 0.999, cosines


# The snippets for a model with prompts: run against a gateway whose model has `query` and `passage`
PROMPT_SNIPPETS = ("langchain-prompts", "llama-index-prompts")


def test_every_snippet_on_the_page_is_run_here():
    assert set(SNIPPETS) == {*EMBEDDING_SNIPPETS, *PROMPT_SNIPPETS, "openai-node", "cohere-rerank"}
    assert all(DOC_URL in code for _, code in SNIPPETS.values())


@pytest.mark.parametrize("name", list(EMBEDDING_SNIPPETS))
def test_the_snippet_gets_sentence_transformers_vectors(stack, reference, tmp_path, name):
    extra = {"langchain-openai": ["query_vector"], "huggingface-hub": ["similarities"]}.get(name, [])
    variables = run_python(name, stack.url, tmp_path, "texts", "vectors", *extra)
    vectors = variables["vectors"]
    assert len(vectors[0]) == EMBEDDING_SNIPPETS[name]
    assert_sentence_transformers_vectors(reference, variables["texts"], vectors)
    if name == "langchain-openai":
        assert_sentence_transformers_vectors(
            reference, ["Where does the cat sit?"], [variables["query_vector"]]
        )
    if name == "huggingface-hub":
        expected = reference.encode(variables["texts"])
        np.testing.assert_allclose(variables["similarities"], expected[1:] @ expected[0], atol=1e-3)


@pytest.mark.parametrize("name", PROMPT_SNIPPETS)
def test_the_prompt_snippet_sends_each_texts_prompt(prompt_gateway, prompt_model_dir, tmp_path, name):
    """The documents come back as sentence-transformers embeds them with the `passage` prompt, the
    query with the `query` prompt: the prompt_name sent through the client's extra arguments acts.
    Without it a query's vector here is at cosine 0.90 to its prompted one."""
    from sentence_transformers import SentenceTransformer

    variables = run_python(name, prompt_gateway.url, tmp_path, "texts", "vectors", "query_vector")
    prompted = SentenceTransformer(str(prompt_model_dir), device="cpu")
    documents = prompted.encode(variables["texts"], prompt_name="passage")
    query = prompted.encode(["Where does the cat sit?"], prompt_name="query")
    assert (np.asarray(variables["vectors"]) * documents).sum(1).min() >= 0.999  # unit vectors: cosines
    assert float(np.dot(variables["query_vector"], query[0])) >= 0.999
    unprompted = prompted.encode(["Where does the cat sit?"])[0]
    assert float(np.dot(variables["query_vector"], unprompted)) < 0.95


def test_the_rerank_snippet_gets_the_cross_encoders_scores(rerank_stack, cross_encoder_dir, tmp_path):
    from sentence_transformers import CrossEncoder

    served = httpx.get(f"{rerank_stack.url}/v1/models", timeout=30).json()["data"][0]["id"]
    ranks = ["[r.index for r in ranked.results]", "[r.index for r in ranked_v1.results]"]
    variables = run_python(
        "cohere-rerank", rerank_stack.url, tmp_path, "query", "documents", "scores", *ranks, reranker=served
    )
    model = CrossEncoder(str(cross_encoder_dir), device="cpu", local_files_only=True)
    # a one-label cross-encoder's predict is the sigmoid of its logit: Cohere's relevance_score
    expected = model.predict([(variables["query"], d) for d in variables["documents"]])
    top = [int(i) for i in np.argsort(-expected)[:2]]
    assert variables[ranks[0]] == variables[ranks[1]] == top
    assert set(variables["scores"]) == {str(i) for i in top}  # JSON's keys are strings
    for index, score in variables["scores"].items():
        assert abs(score - expected[int(index)]) < 1e-3


@pytest.mark.skipif(
    shutil.which("node") is None, reason="no node on this machine: the Node snippet is not run"
)
def test_the_node_snippet_gets_sentence_transformers_vectors(stack, reference, tmp_path):
    if not (NODE_DIR / "node_modules" / "openai").is_dir():
        pytest.skip(f"the Node openai client is not installed: `npm ci --prefix {NODE_DIR}` (make test does)")
    language, code = SNIPPETS["openai-node"]
    assert language == "js"
    script = tmp_path / "embed.mjs"
    script.write_text(code.replace(DOC_URL, stack.url))
    (tmp_path / "node_modules").symlink_to(NODE_DIR / "node_modules")  # found from the script's folder
    done = subprocess.run(["node", str(script)], capture_output=True, text=True, timeout=60, env=os.environ)
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert_sentence_transformers_vectors(reference, printed["texts"], printed["vectors"])


def test_tiktoken_ids_as_langchain_sends_them_are_refused_naming_the_setting(stack):
    """langchain-openai's default request shape: each text as tiktoken's ids, a list of lists of ints
    in `input`. tiktoken's table is fetched from the network on first use, so the ids here are
    written out: ids within this model's vocabulary (30,522) but not framed as its tokenizer frames
    a sequence, and ids past it."""
    ids = [[791, 8415, 23874], [26566, 67123, 13]]
    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key="unused", max_retries=0)
    with client:
        with pytest.raises(openai.BadRequestError) as refused:
            client.embeddings.create(model=MODEL_NAME, input=ids, encoding_format="base64")
        message = str(refused.value)  # the first: ids of this vocabulary's range but not its frame
        assert "input 0's token ids were not made by this model's tokenizer" in message
        assert "check_embedding_ctx_length=False" in message
        with pytest.raises(openai.BadRequestError) as refused:
            client.embeddings.create(model=MODEL_NAME, input=ids[1:], encoding_format="base64")
    message = str(refused.value)
    assert "input 0 has token id 67123 outside [0, 30522)" in message
    assert "this model's own tokenizer" in message and "check_embedding_ctx_length=False" in message


TIKTOKEN_CACHE = Path(__file__).parents[2] / ".venv" / "tiktoken-cache"  # make test fills it


def test_langchain_openais_default_client_is_refused_naming_the_setting(stack, monkeypatch):
    """OpenAIEmbeddings as a new user writes it, check_embedding_ctx_length left at its default:
    langchain tokenizes each text with tiktoken and sends those ids. Every id of "The cat sits on
    the mat." is below the bundled model's 30,522, so before, it answered 200 with a vector at
    cosine 0.015 to the right one; now the gateway refuses ids its tokenizer did not frame, and
    langchain raises the gateway's message."""
    from langchain_openai import OpenAIEmbeddings

    assert (TIKTOKEN_CACHE / ".kembed-installed").is_file(), "tiktoken's table: `make test` fetches it"
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(TIKTOKEN_CACHE))
    embeddings = OpenAIEmbeddings(
        model=MODEL_NAME, base_url=f"{stack.url}/v1", api_key="unused", max_retries=0
    )
    with pytest.raises(openai.BadRequestError) as refused:
        embeddings.embed_documents(["The cat sits on the mat."])
    message = str(refused.value)
    assert "not made by this model's tokenizer" in message and "check_embedding_ctx_length=False" in message


def test_the_settings_the_page_warns_about_fail_as_it_says(stack, monkeypatch):
    """What the page says happens without each setting."""
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no price list fetched at import
    import litellm
    from llama_index.embeddings.openai import OpenAIEmbedding

    with pytest.raises(ValueError, match="is not a valid OpenAIEmbeddingModelType"):
        OpenAIEmbedding(model=MODEL_NAME, api_base=f"{stack.url}/v1", api_key="unused")
    with pytest.raises(litellm.UnsupportedParamsError):
        litellm.embedding(
            model=f"openai/{MODEL_NAME}",
            api_base=f"{stack.url}/v1",
            api_key="unused",
            input=["a"],
            dimensions=64,
        )
    with pytest.raises(litellm.BadRequestError, match="inputs: Field required"):
        litellm.embedding(model=f"cohere/{MODEL_NAME}", api_base=stack.url, api_key="unused", input=["a"])
