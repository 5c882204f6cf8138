"""The few shapes every kembed dashboard is built from, on grafana-foundation-sdk's builders: a
time-series or stat panel of PromQL targets, the datasource/namespace/model/revision variables, and
a dashboard laid out in titled rows of half-width panels.

Every panel queries the `${datasource}` variable, so the dashboards work whatever the Prometheus data
source is called where the Grafana sidecar loads them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as d
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    Threshold,
    ThresholdsMode,
    VariableRefresh,
    VariableSort,
)

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
WIDTH, HEIGHT = 12, 8  # two panels per row of Grafana's 24-column grid
ALL = ".+"  # what "All" of a multi-valued variable sends: any value (and never an empty label)
REF_IDS = "ABCDEFGH"  # a panel's targets; more than eight would not read on one panel anyway


@dataclass(frozen=True)
class Query:
    """One PromQL target: its expression and legend (`{{label}}` placeholders)."""

    expr: str
    legend: str


def graph(
    title: str,
    description: str,
    unit: str,
    queries: Sequence[Query],
    *,
    stacked: bool = False,
    threshold: float | None = None,
) -> timeseries.Panel:
    """A time-series panel; `threshold` draws a dashed red line (an alert's default level)."""
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .min(0)
        .fill_opacity(25 if stacked else 8)
        .span(WIDTH)
        .height(HEIGHT)
        .legend(
            common_builders.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        .tooltip(common_builders.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI))
    )
    if stacked:
        panel = panel.stacking(common_builders.StackingConfig().mode(common.StackingMode.NORMAL))
    if threshold is not None:
        panel = panel.thresholds(
            d.ThresholdsConfig()
            .mode(ThresholdsMode.ABSOLUTE)
            .steps([Threshold(value=None, color="green"), Threshold(value=threshold, color="red")])
        ).thresholds_style(
            common_builders.GraphThresholdsStyleConfig().mode(common.GraphThresholdsStyleMode.DASHED)
        )
    assert len(queries) <= len(REF_IDS), title
    for ref, query in zip(REF_IDS, queries, strict=False):
        panel = panel.with_target(target(query, ref))
    return panel


def total(title: str, description: str, unit: str, queries: Sequence[Query]) -> stat.Panel:
    """A stat panel of instant queries over the dashboard's time range (`$__range`)."""
    panel = (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(WIDTH)
        .height(HEIGHT)
        .graph_mode(common.BigValueGraphMode.NONE)
        .color_mode(common.BigValueColorMode.VALUE)
    )
    assert len(queries) <= len(REF_IDS), title
    for ref, query in zip(REF_IDS, queries, strict=False):
        panel = panel.with_target(target(query, ref, instant=True))
    return panel


def target(query: Query, ref: str, *, instant: bool = False) -> prometheus.Dataquery:
    built = prometheus.Dataquery().expr(query.expr).legend_format(query.legend).ref_id(ref)
    return built.instant() if instant else built.range()


def variables() -> list[d.QueryVariable | d.DatasourceVariable]:
    """Datasource, then namespace → model → revision, each narrowing the next, all multi-valued.
    Workers are what every namespace running kembed has, so their info metric lists the choices."""
    ns = 'namespace=~"$namespace"'

    def choice(name: str, label: str, query: str) -> d.QueryVariable:
        return (
            d.QueryVariable(name)
            .label(label)
            .datasource(DATASOURCE)
            .query(query)
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(ALL)
        )

    return [
        d.DatasourceVariable("datasource").label("Data source").type("prometheus"),
        choice("namespace", "Namespace", "label_values(kembed_worker_info, namespace)"),
        choice("model", "Model", f"label_values(kembed_worker_info{{{ns}}}, model)"),
        choice(
            "revision", "Revision", f'label_values(kembed_worker_info{{{ns}, model=~"$model"}}, revision)'
        ),
    ]


def dashboard(
    uid: str,
    title: str,
    description: str,
    rows: Sequence[tuple[str, Sequence[timeseries.Panel | stat.Panel]]],
) -> d.Dashboard:
    """A dashboard of titled rows; panel ids are numbered in order, as Grafana expects them unique."""
    board = (
        d.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["kembed"])
        .time("now-1h", "now")
        .refresh("30s")
        .timezone("browser")
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .editable()
    )
    for variable in variables():
        board = board.with_variable(variable)
    panel_id = 0
    for row_title, panels in rows:
        panel_id += 1
        board = board.with_row(d.Row(row_title).id(panel_id))
        for panel in panels:
            panel_id += 1
            board = board.with_panel(panel.id(panel_id))
    return board


def to_json(board: d.Dashboard) -> str:
    """The dashboard as Grafana's JSON model, keys sorted so that regeneration is byte-stable."""
    return json.dumps(board.build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"
