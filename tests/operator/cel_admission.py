"""What the API server does with an EmbeddingModel before storing it, as far as CEL goes: apply the
CRD's structural defaults, then evaluate every `x-kubernetes-validations` rule at its node (`self`
the node's value; items and map values each on their own; a rule on an absent optional field is not
evaluated). A rule that errors (a field it names is missing) refuses the object, as it does there.

The rules run in cel-python, a full CEL implementation, not in cel-go with Kubernetes' libraries:
its runtime semantics (has(), macros, matches(), size(), type()) are the language's, but nothing here
type-checks a rule against the schema at CRD creation or estimates its cost, as the API server does.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import celpy
import yaml

CRD = Path(__file__).resolve().parents[2] / "charts/kembed/crds/embeddingmodels.kembed.dev.yaml"


def schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = crd["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]


def with_defaults(value: Any, node: dict[str, Any]) -> Any:
    """`value` with the schema's defaults filled in, as the API server's structural defaulting does:
    an absent property with a default gets it, then every present property (defaulted ones too),
    array item and map value is defaulted by its own schema."""
    if isinstance(value, dict) and "properties" in node:
        out = dict(value)
        for name, child in node["properties"].items():
            if name not in out and "default" in child:
                out[name] = copy.deepcopy(child["default"])
            if name in out:
                out[name] = with_defaults(out[name], child)
        return out
    if isinstance(value, dict) and isinstance(node.get("additionalProperties"), dict):
        return {key: with_defaults(item, node["additionalProperties"]) for key, item in value.items()}
    if isinstance(value, list) and "items" in node:
        return [with_defaults(item, node["items"]) for item in value]
    return value


@dataclass(frozen=True)
class Verdict:
    path: str
    rule: str
    message: str
    outcome: str  # "passed", "refused" (the rule is false) or "error: ..." (it could not be evaluated)


def _nodes(value: Any, node: dict[str, Any], path: str) -> Iterator[tuple[str, Any, dict[str, Any]]]:
    yield path, value, node
    if isinstance(value, dict) and "properties" in node:
        for name, child in node["properties"].items():
            if name in value:
                yield from _nodes(value[name], child, f"{path}.{name}")
    elif isinstance(value, dict) and isinstance(node.get("additionalProperties"), dict):
        for key, item in value.items():
            yield from _nodes(item, node["additionalProperties"], f"{path}[{key}]")
    elif isinstance(value, list) and "items" in node:
        for i, item in enumerate(value):
            yield from _nodes(item, node["items"], f"{path}[{i}]")


_ENVIRONMENT = celpy.Environment()
_PROGRAMS: dict[str, Any] = {}


def _program(rule: str) -> Any:
    if rule not in _PROGRAMS:
        _PROGRAMS[rule] = _ENVIRONMENT.program(_ENVIRONMENT.compile(rule))
    return _PROGRAMS[rule]


def admit(body: dict[str, Any], root: dict[str, Any] | None = None) -> list[Verdict]:
    """Every rule's verdict on `body` once defaulted, in schema order."""
    root = root or schema()
    verdicts = []
    for path, value, node in _nodes(with_defaults(body, root), root, ""):
        for validation in node.get("x-kubernetes-validations", []):
            rule = validation["rule"]
            try:
                result = _program(rule).evaluate({"self": celpy.json_to_cel(value)})
            except celpy.CELEvalError as error:
                outcome = f"error: {error.args[0]}"
            else:
                if isinstance(result, celpy.CELEvalError):
                    outcome = f"error: {result.args[0]}"
                else:
                    outcome = "passed" if bool(result) else "refused"
            verdicts.append(Verdict(path or "(root)", rule, validation.get("message", ""), outcome))
    return verdicts
