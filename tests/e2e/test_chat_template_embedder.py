"""An embedder that sentence-transformers 6 saved with a tokenizer that has a chat template, through a
real gateway and worker: sentence-transformers renders each text as a user message (its prompt a
system message before it) and tokenizes the render without special tokens, restoring the template's
tail over a truncated row's end; the gateway does the same, so `/v1/embeddings` and TEI's `/embed`
give `SentenceTransformer(dir).encode`'s vectors (last-token pooling reads the template's last token,
so a missing or cut tail shows). A tiny Qwen2 decoder; the tokenizer adds bos/eos itself, which the
rendered text must not get."""

import json
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
from processes import start_stack

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "worker"))
from decoder_dirs import bpe_tokenizer, save_decoder

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
PROMPTS = {"query": "Given a web search query, retrieve relevant passages", "document": ""}
MAX_LENGTH = 24
TEXTS = ["what is paris", "the capital of france is paris", "a b c", " ".join(["paris is big"] * 12)]


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling

    base = tmp_path_factory.mktemp("chat-embedder")
    raw = base / "raw"
    model = save_decoder(raw, "qwen2")
    bpe_tokenizer(chat_template=TEMPLATE, bos_eos=True).save_pretrained(raw)
    transformer = Transformer(str(raw), max_seq_length=MAX_LENGTH)
    pooling = Pooling(model.config.hidden_size, pooling_mode="lasttoken")
    st = SentenceTransformer(modules=[transformer, pooling, Normalize()], prompts=PROMPTS, device="cpu")
    st.save(str(base / "chat-embedder"))
    return base / "chat-embedder"


@pytest.fixture(scope="module")
def reference(model_dir):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(model_dir), device="cpu")


@pytest.fixture(scope="module")
def chat_stack(log_dir, model_dir):
    started = start_stack(log_dir, num_workers=1, model_dir=model_dir, worker_model_dir=model_dir)
    yield started
    for proc in started.processes:
        proc.stop()


def test_the_directory_renders_texts_through_its_template(model_dir, reference):
    """The setup is the case: sentence-transformers 6 wrote a message modality, its features for a
    text are the rendered message without bos/eos, and the long text is truncated."""
    sbert = json.loads((model_dir / "sentence_bert_config.json").read_text())
    assert "message" in sbert["modality_config"]
    features = reference.preprocess(["what is paris", TEXTS[-1]])
    lengths = features["attention_mask"].sum(1).tolist()
    assert lengths[1] == MAX_LENGTH
    tokens = reference.tokenizer.convert_ids_to_tokens(features["input_ids"][0][: lengths[0]].tolist())
    assert tokens[0] == "<|im_start|>" and "<|im_end|>" in tokens and "<s>" not in tokens[:1]


@pytest.mark.parametrize("prompt_name", [None, "query"])
def test_vectors_match_sentence_transformers(chat_stack, reference, prompt_name):
    body = {"input": TEXTS, **({"prompt_name": prompt_name} if prompt_name else {})}
    response = httpx.post(f"{chat_stack.url}/v1/embeddings", json=body, timeout=60)
    assert response.status_code == 200, response.text
    rows = np.array([item["embedding"] for item in response.json()["data"]], np.float32)
    want = reference.encode(TEXTS, prompt_name=prompt_name)
    assert cosine_rows(rows, want).min() >= 0.999
    tei = httpx.post(
        f"{chat_stack.url}/embed", json={"inputs": TEXTS, "prompt_name": prompt_name}, timeout=60
    )
    assert tei.status_code == 200, tei.text
    assert cosine_rows(np.array(tei.json(), np.float32), want).min() >= 0.999


def test_an_over_long_text_without_truncation_is_a_413(chat_stack):
    response = httpx.post(
        f"{chat_stack.url}/embed", json={"inputs": TEXTS[-1], "truncate": False}, timeout=60
    )
    assert response.status_code == 413, response.text
    assert "chat template" in response.text


def test_tokenize_shows_the_rendered_message(chat_stack, reference):
    response = httpx.post(f"{chat_stack.url}/tokenize", json={"inputs": "what is paris"}, timeout=60)
    assert response.status_code == 200, response.text
    ids = [token["id"] for token in response.json()[0]]
    features = reference.preprocess(["what is paris"])
    assert ids == features["input_ids"][0][: int(features["attention_mask"][0].sum())].tolist()
