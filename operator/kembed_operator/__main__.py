"""`python -m kembed.operator`: parse settings once, register the handlers, run kopf.

Standalone (no peering): run one replica. Watches the namespaces in the settings, or all of them.
"""

from __future__ import annotations

import logging
import sys

import kopf

from kembed.operator.handlers import register
from kembed.operator.metrics import OperatorMetrics, serve_metrics
from kembed.operator.settings import parse_settings


def main(argv: list[str] | None = None) -> None:
    settings = parse_settings(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    metrics = OperatorMetrics()
    if settings.metrics_port:
        _, port = serve_metrics(metrics.registry, settings.metrics_port)
        logging.getLogger("kembed.operator").info("operator metrics on :%d/metrics", port)
    registry = kopf.OperatorRegistry()
    register(registry, settings, metrics)
    kopf.run(
        registry=registry,
        standalone=True,
        clusterwide=not settings.namespaces,
        namespaces=list(settings.namespaces),
        liveness_endpoint=f"http://0.0.0.0:{settings.health_port}/healthz",
    )


if __name__ == "__main__":
    main()
