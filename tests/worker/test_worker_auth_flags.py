"""The worker's token from a file or KEMBED_WORKER_AUTH_TOKEN, never a flag's value, never in a repr."""

from pathlib import Path

import pytest

from kembed.worker.__main__ import parse_config


def test_token_comes_from_its_file_before_the_environment(tmp_path: Path):
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    env = {"KEMBED_WORKER_AUTH_TOKEN": "from-env"}
    config = parse_config(["--model", str(tmp_path), "--auth-token-file", str(token_file)], env)
    assert (config.auth_token, config.auth_data) == ("from-file", True)
    assert "from-file" not in repr(config)
    assert parse_config(["--model", str(tmp_path)], env).auth_token == "from-env"
    assert parse_config(["--model", str(tmp_path)], {}).auth_token == ""


def test_data_calls_can_be_left_open(tmp_path: Path):
    assert not parse_config(["--model", str(tmp_path), "--no-auth-data"], {}).auth_data
    assert not parse_config(["--model", str(tmp_path)], {"KEMBED_WORKER_AUTH_DATA": "false"}).auth_data


def test_a_token_value_on_the_command_line_or_a_missing_file_is_refused(tmp_path: Path, capsys):
    with pytest.raises(SystemExit):
        parse_config(["--model", str(tmp_path), "--auth-token", "visible-to-ps"], {})
    with pytest.raises(SystemExit):
        parse_config(["--model", str(tmp_path), "--auth-token-file", str(tmp_path / "none")], {})
    assert "cannot read --auth-token-file" in capsys.readouterr().err
