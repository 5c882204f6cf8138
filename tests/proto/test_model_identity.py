"""A model directory's digests (kembed.proto.model_identity): the same for the same model under any
name or prompts, different wherever ids or vectors would differ."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kembed.proto.model_files import load_model_spec
from kembed.proto.model_identity import ModelIdentity, read_identity
from kembed.worker.config import bundled_model_dir


def identity_of(path: Path) -> ModelIdentity:
    return read_identity(path, load_model_spec(path))


@pytest.fixture(scope="module")
def bundled() -> ModelIdentity:
    return identity_of(bundled_model_dir())


def edited(tmp_path: Path, name: str, file: str, edit) -> Path:
    target = tmp_path / name
    shutil.copytree(bundled_model_dir(), target)
    path = target / file
    if path.suffix == ".json":
        path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    else:
        edit(path)
    return target


def test_the_same_model_under_another_name_with_other_prompts_is_the_same(tmp_path, bundled):
    def prompts(config):
        return config | {"prompts": {"query": "query: "}, "default_prompt_name": "query"}

    renamed = edited(tmp_path, "another-name", "config_sentence_transformers.json", prompts)
    (renamed / ".cache").mkdir()
    (renamed / ".cache" / "stale.safetensors").write_bytes(b"not part of the model")
    assert identity_of(renamed) == bundled
    assert bundled.tokenizer.startswith("sha256:") and bundled.model.startswith("sha256:")


@pytest.mark.parametrize(
    ("file", "edit", "changes"),
    [
        (
            "tokenizer.json",
            lambda t: {**t, "normalizer": {**t["normalizer"], "lowercase": False}},
            "tokenizer",
        ),
        ("sentence_bert_config.json", lambda c: {**c, "max_seq_length": 512}, "tokenizer"),
        ("sentence_bert_config.json", lambda c: {**c, "do_lower_case": True}, "tokenizer"),
        ("tokenizer_config.json", lambda c: {**c, "truncation_side": "left"}, "tokenizer"),
        (
            "1_Pooling/config.json",
            lambda c: {**c, "pooling_mode_mean_tokens": False, "pooling_mode_cls_token": True},
            "model",
        ),
        ("modules.json", lambda m: m[:2], "model"),
        ("model.safetensors", lambda p: p.write_bytes(p.read_bytes()[:-4] + b"\0\0\0\1"), "model"),
    ],
    ids=[
        "cased-tokenizer",
        "max-seq-length",
        "lowercasing",
        "truncation-side",
        "pooling",
        "no-normalize",
        "weights",
    ],
)
def test_a_change_that_moves_ids_or_vectors_changes_its_digest(tmp_path, bundled, file, edit, changes):
    got = identity_of(edited(tmp_path, "edited", file, edit))
    kept = "model" if changes == "tokenizer" else "tokenizer"
    assert getattr(got, changes) != getattr(bundled, changes)
    assert getattr(got, kept) == getattr(bundled, kept)


def test_a_directory_without_weights_has_no_model_digest(tmp_path, bundled):
    target = tmp_path / "tokenizer-only"
    shutil.copytree(bundled_model_dir(), target, ignore=shutil.ignore_patterns("*.safetensors"))
    assert identity_of(target) == ModelIdentity(bundled.tokenizer, "")
