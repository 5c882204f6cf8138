"""The worker's prewarm settings from flags and KEMBED_WORKER_* variables, and what the eager (CPU)
engine answers to the prewarm and inline-launch calls the scheduler makes of any engine."""

import logging
from pathlib import Path

import numpy as np
import pytest

from kembed.worker.__main__ import hot_first, parse_config
from kembed.worker.buckets import Bucket
from kembed.worker.config import WorkerConfig, bundled_model_dir
from kembed.worker.engine import load_engine


def test_defaults_prewarm_every_reachable_bucket_within_two_minutes(tmp_path: Path):
    config = parse_config(["--model", str(tmp_path)], {})
    assert (config.prewarm, config.prewarm_hot, config.prewarm_seconds) == ("all", (), 120.0)
    assert config.max_graphs == 1024


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        (["--prewarm", "none"], {}, ("none", (), 120.0)),
        (["--prewarm", "ALL"], {"KEMBED_WORKER_PREWARM": "none"}, ("all", (), 120.0)),
        ([], {"KEMBED_WORKER_PREWARM": "1x128, 8x512"}, ((Bucket(1, 128), Bucket(8, 512)), (), 120.0)),
        (
            ["--prewarm-hot", "8x512,1x64", "--prewarm-seconds", "30"],
            {"KEMBED_WORKER_PREWARM_HOT": "2x64", "KEMBED_WORKER_PREWARM_SECONDS": "5"},
            ("all", (Bucket(8, 512), Bucket(1, 64)), 30.0),
        ),
        (
            [],
            {"KEMBED_WORKER_PREWARM_HOT": "2x64", "KEMBED_WORKER_PREWARM_SECONDS": "0.5"},
            ("all", (Bucket(2, 64),), 0.5),
        ),
    ],
    ids=["flag-none", "flag-wins-over-env", "env-list", "flags-win", "env-hot-and-budget"],
)
def test_prewarm_flags_win_over_environment(tmp_path: Path, argv, env, expected):
    config = parse_config(["--model", str(tmp_path), *argv], env)
    assert (config.prewarm, config.prewarm_hot, config.prewarm_seconds) == expected


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        ([], {}, ()),
        ([], {"KEMBED_WORKER_PREWARM_OBSERVED": ""}, ()),  # the operator's ConfigMap holds no list yet
        ([], {"KEMBED_WORKER_PREWARM_OBSERVED": "8x512, 1x64,8x512"}, (Bucket(8, 512), Bucket(1, 64))),
        (["--prewarm-observed", "2x128"], {"KEMBED_WORKER_PREWARM_OBSERVED": "8x512"}, (Bucket(2, 128),)),
    ],
    ids=["unset", "empty", "env-deduplicated", "flag-wins"],
)
def test_the_observed_hot_list_comes_from_its_flag_or_variable(tmp_path: Path, argv, env, expected):
    assert parse_config(["--model", str(tmp_path), *argv], env).prewarm_observed == expected


def test_a_malformed_observed_hot_list_is_refused_at_parse_time(tmp_path: Path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_config(["--model", str(tmp_path)], {"KEMBED_WORKER_PREWARM_OBSERVED": "8x512,big"})
    assert exit_info.value.code == 2 and "SEQSxTOKENS" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("prewarm", "says"),
    [("all", "prewarming 2 hot buckets from the operator's hot list"), ("none", "are not captured")],
    ids=["all", "none"],
)
def test_observed_hot_buckets_come_after_the_listed_ones_and_are_logged(tmp_path, caplog, prewarm, says):
    config = WorkerConfig(
        model=tmp_path,
        prewarm=prewarm,
        prewarm_hot=(Bucket(1, 64),),
        prewarm_observed=(Bucket(8, 512), Bucket(1, 64)),
    )
    with caplog.at_level(logging.INFO, logger="kembed.worker"):
        assert hot_first(config) == (Bucket(1, 64), Bucket(8, 512))
    assert says in caplog.text


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--prewarm", "some"], "SEQSxTOKENS"),
        (["--prewarm-hot", "8x"], "SEQSxTOKENS"),
        (["--prewarm-seconds", "-1"], "prewarm_seconds must be >= 0"),
        (["--prewarm-seconds", "nan"], "prewarm_seconds must be >= 0"),
    ],
    ids=["bad-word", "bad-bucket", "negative-budget", "nan-budget"],
)
def test_bad_prewarm_settings_are_refused_at_parse_time(tmp_path: Path, argv, says, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_config(["--model", str(tmp_path), *argv], {})
    assert exit_info.value.code == 2 and says in capsys.readouterr().err


def test_the_config_refuses_an_unknown_prewarm_word(tmp_path: Path):
    with pytest.raises(ValueError, match="prewarm must be all, none or a list"):
        WorkerConfig(model=tmp_path, prewarm="hot")


@pytest.fixture(scope="module")
def cpu_engine():
    model = bundled_model_dir()
    if model is None:
        pytest.skip("the bundled model package is not installed")
    return load_engine(WorkerConfig(model=model, device="cpu", max_batch_tokens=256))


def test_the_eager_engine_prewarms_nothing_defers_nothing_and_never_launches_inline(cpu_engine):
    assert cpu_engine.prewarm_at_start("all", (Bucket(1, 64),), 120.0) is None
    assert cpu_engine.capture_deferred(1.0) == 0
    batch = cpu_engine.pack(np.arange(5, 15, dtype=np.int32), np.array([4, 6], np.int32))
    assert cpu_engine.can_launch_inline(batch) is False
    assert cpu_engine.step(batch).wait().shape == (2, cpu_engine.info.dimensions)


def test_the_eager_engine_records_the_named_start_up_buckets_as_its_prewarm_does():
    model = bundled_model_dir()
    if model is None:
        pytest.skip("the bundled model package is not installed")
    engine = load_engine(WorkerConfig(model=model, device="cpu", max_batch_tokens=256))
    engine.prewarm_at_start("none", (Bucket(2, 128),), 120.0)
    assert engine.bucket_stats() == []  # `none`: nothing at start
    engine.prewarm_at_start((Bucket(4, 256),), (Bucket(2, 128), Bucket(1, 1 << 20)), 120.0)
    recorded = {bucket for bucket, hits, captured in engine.bucket_stats() if captured}
    assert recorded == {Bucket(2, 128), Bucket(4, 256)}  # a bucket past the table is dropped
