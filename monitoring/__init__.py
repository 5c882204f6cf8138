"""kembed.monitoring: the Grafana dashboards and Prometheus alerts, written as code.

`python -P -m kembed.monitoring` (`make dashboards`) writes them into the chart: one JSON file per
dashboard under charts/kembed/dashboards/ and the PrometheusRule template. Both build their PromQL
from `promql`, so a panel and an alert about the same thing run the same expression. This package
runs at build time only (it needs the `dashboards` extra); it imports none of the services' code: the
metric names it uses are the contract in docs/metrics.md, and tests/metrics checks every query
against a real Prometheus scraping real processes.
"""
