"""`kembed-worker --help` is generated from WorkerConfig: every field a flag with its docstring, its
default and its environment variable; the subcommands listed; answered without torch. Every field's
variable is read, and a bad value is refused naming the variable."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kembed.worker.buckets import Bucket
from kembed.worker.cli import COMMANDS, env_name, field_docs, flag_name, parse_config
from kembed.worker.config import WorkerConfig

FIELDS = dataclasses.fields(WorkerConfig)


def help_text(*argv: str) -> str:
    """What the installed entry point prints for `argv`, whitespace folded, and the modules it loaded."""
    code = (
        "import sys, json\n"
        "from kembed.worker.__main__ import main\n"
        "try:\n"
        f"    main({list(argv)!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(json.dumps(sorted(sys.modules)), file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return " ".join(done.stdout.split()) + "\n" + done.stderr


def test_every_field_has_a_docstring():
    assert set(field_docs()) == {field.name for field in FIELDS}


def test_every_field_is_a_flag_with_its_help_default_and_variable():
    text = help_text("--help").split("\n")[0]
    for field in FIELDS:
        flag, variable = flag_name(field.name), env_name(field.name)
        first_words = " ".join(field_docs()[field.name].split()[:4])
        # the flag's own entry: from the flag to the first `[env ...]`, which must be its variable
        entry = re.search(
            re.escape(flag) + r"[ ,](?:(?!\[env ).)*\[env ([A-Z_]+)[^\]]*; default ([^\]]+)\]", text
        )
        assert entry is not None, f"{flag} has no [env ...; default ...] in --help"
        assert entry.group(1) == variable, f"{flag}: documented as {entry.group(1)}, read as {variable}"
        assert first_words.lower() in entry.group(0).lower(), f"{flag}: its help is not its field's docstring"
        default = field.default
        if isinstance(default, bool):
            assert entry.group(2) == ("on" if default else "off"), flag
        elif isinstance(default, int | float) or (isinstance(default, str) and default):
            assert entry.group(2) == str(default), flag


def test_the_subcommands_are_listed_in_the_main_help():
    text = help_text("--help").split("\n")[0]
    for name, (_, line) in COMMANDS.items():
        assert f"{name} {' '.join(line.split())}" in text


@pytest.mark.parametrize("argv", [["--help"], ["stats", "--help"]], ids=["serve", "stats"])
def test_help_answers_without_torch(argv):
    out, modules = help_text(*argv).split("\n", 1)
    assert "usage:" in out
    loaded = set(json.loads(modules.strip().splitlines()[-1]))
    assert "torch" not in loaded
    if argv == ["--help"]:
        assert "grpc" not in loaded


# A value other than the default for each field, as its variable would carry it, and what it parses to.
SAMPLES = {
    "pooling": ("cls", "cls"),
    "normalize": ("false", False),
    "adapter": ("retrieval.query", "retrieval.query"),
    "served_model_name": ("m", "m"),
    "host": ("0.0.0.0", "0.0.0.0"),
    "device": ("cpu", "cpu"),
    "dtype": ("float16", "float16"),
    "attention_backend": ("sdpa", "sdpa"),
    "linear_dtype": ("fp8", "fp8"),
    "prewarm": ("1x64,2x128", (Bucket(1, 64), Bucket(2, 128))),
    "prewarm_hot": ("8x512", (Bucket(8, 512),)),
    "prewarm_observed": ("4x256,1x128", (Bucket(4, 256), Bucket(1, 128))),
    "revision": ("abc123", "abc123"),
    "auth_token": (" secret\n", "secret"),
    "log_level": ("debug", "DEBUG"),
}


def sample(field: dataclasses.Field, tmp_path: Path) -> tuple[str, object]:
    if field.name == "model":
        return str(tmp_path), tmp_path
    if field.name in SAMPLES:
        return SAMPLES[field.name]
    if isinstance(field.default, bool):
        return ("false" if field.default else "true"), not field.default
    if isinstance(field.default, int):
        return str(field.default + 1), field.default + 1
    assert isinstance(field.default, float), f"add a sample for {field.name}"
    return str(field.default / 2), field.default / 2


@pytest.mark.parametrize("field", FIELDS, ids=[field.name for field in FIELDS])
def test_every_fields_variable_is_read(field, tmp_path: Path):
    raw, expected = sample(field, tmp_path)
    argv = [] if field.name == "model" else ["--model", str(tmp_path)]
    assert getattr(parse_config(argv, {}), field.name) != expected
    assert getattr(parse_config(argv, {env_name(field.name): raw}), field.name) == expected


def test_the_token_file_comes_from_its_variable_too(tmp_path: Path):
    token = tmp_path / "token"
    token.write_text("from-file\n")
    env = {"KEMBED_WORKER_AUTH_TOKEN_FILE": str(token), "KEMBED_WORKER_AUTH_TOKEN": "from-env"}
    assert parse_config(["--model", str(tmp_path)], env).auth_token == "from-file"


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"KEMBED_WORKER_PORT": "http"}, "KEMBED_WORKER_PORT: invalid int value 'http'"),
        ({"KEMBED_WORKER_PREWARM_SECONDS": "soon"}, "KEMBED_WORKER_PREWARM_SECONDS: invalid float value"),
        ({"KEMBED_WORKER_CUDA_GRAPHS": "ture"}, "KEMBED_WORKER_CUDA_GRAPHS: expected true or false"),
        ({"KEMBED_WORKER_PREWARM_HOT": "8x"}, "KEMBED_WORKER_PREWARM_HOT: buckets are SEQSxTOKENS"),
        ({"KEMBED_WORKER_LOG_LEVEL": "loud"}, "log level must be one of DEBUG, INFO"),
    ],
    ids=["int", "float", "bool-typo", "bucket", "log-level"],
)
def test_a_bad_variable_is_refused_naming_it(tmp_path: Path, env, says, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_config(["--model", str(tmp_path)], env)
    assert exit_info.value.code == 2 and says in capsys.readouterr().err


def test_a_command_after_flags_is_pointed_to_the_front(tmp_path: Path, capsys):
    with pytest.raises(SystemExit):
        parse_config(["--model", str(tmp_path), "stats", "--target", "x:1"], {})
    assert "the command comes first" in capsys.readouterr().err
