"""One observed run for the metrics tests (observed_run.py says what runs): started once, queried
by every test of the module, stopped after it (not kept through the rest of the session).

With KEMBED_METRICS_PLOTS=<dir> (`make metrics-plots`) the run also writes the PNG plots of the
latency and pinned-memory panels there.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from metrics_load import load_beside_outage
from observed_run import IDLE_AFTER_S, ObservedRun, e2e_processes, start_services
from operator_feed import OperatorFeed
from prom_server import Prometheus

from kembed.monitoring.alerts import rule_groups


@pytest.fixture(scope="module")
def observed(tmp_path_factory) -> Iterator[ObservedRun]:
    directory = tmp_path_factory.mktemp("observed")
    feed = OperatorFeed()
    processes: list = []
    prometheus = None
    try:
        services = start_services(directory, feed, processes)
        targets = services.targets
        prometheus = Prometheus(directory, e2e_processes().free_port(), targets, rule_groups())
        prometheus.wait_ready()
        prometheus.wait_scraped(len(targets))
        feed.start_reconciling()
        time.sleep(2)  # a few scrapes of the idle state first: counters start from a sample
        load_start = time.time()
        feed.roll_out()
        statuses, lost_statuses = asyncio.run(load_beside_outage(services.url, services.lost_url))
        load_end = time.time()
        time.sleep(IDLE_AFTER_S)
        run = ObservedRun(prometheus, targets, load_start, load_end, time.time(), statuses, lost_statuses)
        plots = os.environ.get("KEMBED_METRICS_PLOTS")
        if plots:
            from panel_plots import plot_run

            plot_run(run, Path(plots))
        yield run
    finally:
        feed.stop()
        if prometheus is not None:
            prometheus.stop()
        for proc in processes:
            proc.stop()
