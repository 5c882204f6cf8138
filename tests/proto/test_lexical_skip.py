"""The tokens a BGE-M3 sparse vector leaves out (proto/model_files.py `_lexical_skip`), as FlagEmbedding
leaves them out: the cls, eos, pad and unk tokens of the tokenizer AutoTokenizer loads, whose
`special_tokens_map` falls back to its class's defaults where the directory's files name none."""

import inspect
import json
import shutil

import pytest
import transformers
from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES

from kembed.proto.model_files import _CLASS_SPECIALS, _MODEL_TYPE_TOKENIZERS, LEXICAL_SKIP, load_model_spec
from kembed.worker.config import bundled_model_dir


@pytest.mark.parametrize("name", list(_CLASS_SPECIALS))
def test_each_class_default_is_the_transformers_classs_own(name):
    parameters = inspect.signature(getattr(transformers, name).__init__).parameters
    defaults = tuple(parameters[key].default if key in parameters else None for key in LEXICAL_SKIP)
    assert _CLASS_SPECIALS[name] == defaults


def test_each_model_type_picks_the_class_autotokenizer_picks():
    assert {t: TOKENIZER_MAPPING_NAMES[t] for t in _MODEL_TYPE_TOKENIZERS} == _MODEL_TYPE_TOKENIZERS


def spec_with(tmp_path, tokenizer_config: dict, special_map: dict | None = None, model_type: str = "bert"):
    shutil.copy(bundled_model_dir() / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    if special_map is not None:
        (tmp_path / "special_tokens_map.json").write_text(json.dumps(special_map))
    return load_model_spec(tmp_path)


@pytest.mark.parametrize(
    ("tokenizer_config", "special_map", "model_type", "skipped"),
    [
        (
            {"tokenizer_class": "XLMRobertaTokenizerFast"},
            None,
            "xlm-roberta",
            ("<s>", "</s>", "<pad>", "<unk>"),
        ),
        ({}, None, "xlm-roberta", ("<s>", "</s>", "<pad>", "<unk>")),  # the class by model_type
        ({}, None, "bert", ("[CLS]", "[PAD]", "[UNK]")),  # BERT's class has no eos token
        (
            {"tokenizer_class": "XLMRobertaTokenizer", "unk_token": None},
            None,
            "xlm-roberta",
            ("<s>", "</s>", "<pad>"),
        ),
        (
            {"cls_token": "<c>"},
            {"pad_token": {"content": "<p>"}},
            "xlm-roberta",
            ("<c>", "</s>", "<p>", "<unk>"),
        ),
        ({"tokenizer_class": "PreTrainedTokenizerFast"}, None, "modernbert", ()),  # a class without defaults
    ],
    ids=["class-named", "class-by-model-type", "bert-no-eos", "named-null", "files-first", "no-defaults"],
)
def test_the_files_name_the_tokens_else_the_class_does(
    tmp_path, tokenizer_config, special_map, model_type, skipped
):
    assert spec_with(tmp_path, tokenizer_config, special_map, model_type).lexical_skip == skipped
