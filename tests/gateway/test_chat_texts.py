"""An embedder's texts through its chat template (gateway/tokenizing/chat_texts.py) give the ids
sentence-transformers 6 gives them (`SentenceTransformer.preprocess`): a user message, the prompt a
system message before it, no special tokens of the tokenizer's own, and past max_seq_length the
render cut on its side with the template's tail written back; templates that rewrite a text are
refused at start."""

import asyncio
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "worker"))
from decoder_dirs import bpe_tokenizer, save_decoder

from kembed.gateway.tokenizing.tokenization import Tokenization
from kembed.proto.model_files import load_model_spec

TEMPLATE = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
STRUCTURED = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content[0].text }}<|im_end|>\n{% endfor %}"
)
TEXTS = ["what is paris", "a", " ".join(["paris is big"] * 12), "the  capital\nof france"]


def build(path: Path, template: str, side: str = "right") -> Path:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    raw = path / "raw"
    model = save_decoder(raw, "qwen2")
    tokenizer = bpe_tokenizer(chat_template=template, bos_eos=True)
    tokenizer.truncation_side = side
    tokenizer.save_pretrained(raw)
    transformer = Transformer(str(raw), max_seq_length=20)
    st = SentenceTransformer(
        modules=[transformer, Pooling(model.config.hidden_size, pooling_mode="lasttoken")],
        prompts={"query": "Find passages about it", "document": ""},
        device="cpu",
    )
    st.save(str(path / "model"))
    return path / "model"


@pytest.mark.parametrize(
    ("template", "side"), [(TEMPLATE, "right"), (STRUCTURED, "right"), (TEMPLATE, "left")]
)
@pytest.mark.parametrize("prompt_name", [None, "query"])
def test_ids_are_sentence_transformers(tmp_path, template, side, prompt_name):
    from sentence_transformers import SentenceTransformer

    path = build(tmp_path, template, side)
    st = SentenceTransformer(str(path), device="cpu")
    features = st.preprocess(TEXTS, prompt=st.prompts[prompt_name] if prompt_name else None)
    want = [
        row[mask.bool()].tolist()
        for row, mask in zip(features["input_ids"], features["attention_mask"], strict=True)
    ]
    assert max(len(w) for w in want) == 20  # the long text reached the limit
    tokenization = Tokenization(load_model_spec(path), num_threads=1)
    try:
        got = asyncio.run(
            tokenization.encode(
                TEXTS, truncate=True, direction=None, prompt_name=prompt_name, vocab_size=10**6
            )
        )
    finally:
        tokenization.close()
    assert [g.tolist() for g in got] == want


def test_a_template_that_rewrites_the_text_is_refused_at_start(tmp_path):
    path = build(tmp_path, "{% for m in messages %}{{ m.content | trim }}{% endfor %}")
    with pytest.raises(ValueError, match="changes a text as it writes it"):
        Tokenization(load_model_spec(path), num_threads=1)
