"""The worker's data port setting from its flag and KEMBED_WORKER_DATA_PORT."""

from pathlib import Path

import pytest

from kembed.worker.__main__ import parse_config


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        ([], {}, 0),
        (["--data-port", "50052"], {}, 50052),
        ([], {"KEMBED_WORKER_DATA_PORT": "-1"}, -1),
        (["--data-port", "7"], {"KEMBED_WORKER_DATA_PORT": "8"}, 7),
    ],
    ids=["default-any-free-port", "flag", "env-off", "flag-wins"],
)
def test_data_port_comes_from_flag_then_environment(tmp_path: Path, argv, env, expected):
    assert parse_config(["--model", str(tmp_path), *argv], env).data_port == expected


def test_a_data_port_out_of_range_is_refused(tmp_path: Path, capsys):
    with pytest.raises(SystemExit):
        parse_config(["--model", str(tmp_path), "--data-port", "-2"], {})
    assert "data_port must be -1 (off), 0 (any free port) or a port number" in capsys.readouterr().err
