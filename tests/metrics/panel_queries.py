"""Every PromQL query of the generated dashboards (the committed JSON, as Grafana would load it) and
what Grafana would send for it: template variables resolved against Prometheus and substituted."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from prom_server import Prometheus

from kembed.monitoring.generate import DASHBOARD_DIR, DASHBOARDS

LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.*),\s*(?P<label>\w+)\)$")
REGEX_SPECIAL = set(r"\.^$*+?()[]{}|")


@dataclass(frozen=True)
class PanelQuery:
    dashboard: str
    panel: str
    ref: str
    expr: str
    is_instant: bool

    @property
    def key(self) -> str:
        return f"{self.dashboard} / {self.panel} / {self.ref}"


def load(name: str) -> dict:
    return json.loads((DASHBOARD_DIR / f"{name}.json").read_text())


def panel_queries(name: str) -> list[PanelQuery]:
    return [
        PanelQuery(name, panel["title"], target["refId"], target["expr"], bool(target.get("instant")))
        for panel in load(name)["panels"]
        if panel["type"] != "row"
        for target in panel["targets"]
    ]


def all_panel_queries() -> list[PanelQuery]:
    return [query for name in DASHBOARDS for query in panel_queries(name)]


def regex_value(values: list[str]) -> str:
    """A multi-valued variable as Grafana puts it into `=~"..."`: escaped values joined by `|` (a
    backslash doubled, as a PromQL string literal needs)."""
    escaped = ["".join("\\\\" + c if c in REGEX_SPECIAL else c for c in value) for value in values]
    return "|".join(escaped)


def resolve_variables(prometheus: Prometheus, name: str, start: float, end: float) -> dict[str, list[str]]:
    """Each query variable's choices, in order, each narrowed by the ones before (as Grafana does)."""
    choices: dict[str, list[str]] = {}
    for variable in load(name)["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = LABEL_VALUES.match(variable["query"])
        assert match, f"{name}: ${variable['name']} is not a label_values() query: {variable['query']}"
        selector = substitute(match["selector"], choices)
        choices[variable["name"]] = prometheus.label_values(match["label"], selector, start, end)
    return choices


def substitute(expr: str, choices: dict[str, list[str]], rate_interval: str = "", range_: str = "") -> str:
    """Grafana's variables replaced: ours by every choice, `$__rate_interval` and `$__range`."""
    text = expr.replace("$__rate_interval", rate_interval).replace("$__range", range_)
    for variable, values in sorted(choices.items(), key=lambda item: -len(item[0])):
        text = text.replace(f"${variable}", regex_value(values))
    assert "$" not in text, f"unresolved variable in {text}"
    return text
