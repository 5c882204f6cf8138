"""Reading a model directory: pooling and normalisation as sentence-transformers builds its pipeline."""

import json

import pytest
from st_pipeline import write_pipeline

from kembed.worker.config import bundled_model_dir
from kembed.worker.engine.models.model_dir import read_model_dir
from kembed.worker.errors import InvalidInput


def make_dir(tmp_path, pooling_config: dict | None, normalize: bool):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    if pooling_config is None:
        return tmp_path
    write_pipeline(tmp_path, pooling_config, normalize)
    return tmp_path


@pytest.mark.parametrize(
    ("pooling_config", "normalize", "expected"),
    [
        ({"pooling_mode_cls_token": True}, True, ("cls", True)),
        ({"pooling_mode_mean_tokens": True}, False, ("mean", False)),
        ({"pooling_mode_lasttoken": True}, True, ("last", True)),
        ({"pooling_mode": "lasttoken"}, False, ("last", False)),
        (None, False, (None, False)),  # no pipeline: the model family's default pooling applies
    ],
    ids=["cls-normalized", "mean-raw", "last-flag", "last-by-name", "bare-transformers-dir"],
)
def test_pooling_and_normalize_follow_the_sentence_transformers_files(
    tmp_path, pooling_config, normalize, expected
):
    parsed = read_model_dir(make_dir(tmp_path, pooling_config, normalize))
    assert (parsed.pooling, parsed.normalize) == expected


def test_the_bundled_model_is_mean_pooled_and_normalized():
    parsed = read_model_dir(bundled_model_dir())
    assert (parsed.model_type, parsed.pooling, parsed.normalize) == ("bert", "mean", True)


def test_max_pooling_is_refused_with_its_name(tmp_path):
    with pytest.raises(InvalidInput, match="pooling_mode_max_tokens"):
        read_model_dir(make_dir(tmp_path, {"pooling_mode_max_tokens": True}, False))


def test_a_directory_without_config_is_refused(tmp_path):
    with pytest.raises(InvalidInput, match=r"config\.json is missing"):
        read_model_dir(tmp_path)


@pytest.mark.parametrize("backend", ["auto", "sdpa", "sdpa-padded", "torch-varlen"])
def test_every_documented_attention_backend_is_a_valid_setting(backend):
    from kembed.worker.config import WorkerConfig

    assert WorkerConfig(model=bundled_model_dir(), attention_backend=backend).attention_backend == backend


def test_an_unknown_attention_backend_is_refused_with_the_choices():
    from kembed.worker.config import WorkerConfig

    with pytest.raises(ValueError, match="torch-varlen"):
        WorkerConfig(model=bundled_model_dir(), attention_backend="flash-attn-9")
