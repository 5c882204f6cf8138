"""`OperatorSettings`: the operator's one configuration, from flags and `KEMBED_OPERATOR_*` environment.

Parsed once in `__main__`; nothing else reads the environment. A flag wins over the environment,
which wins over the default.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, fields

ENV_PREFIX = "KEMBED_OPERATOR_"


@dataclass(frozen=True)
class OperatorSettings:
    """Everything the operator is told at start."""

    namespaces: tuple[str, ...] = ()
    """Namespaces whose EmbeddingModels it reconciles (comma-separated in the environment). Empty
    means every namespace, which needs a ClusterRole; the chart's default is its own namespace."""

    reconcile_interval_s: float = 10.0
    """Seconds between timer passes over each model. The timer moves rollouts along (the operator does
    not watch Deployments and Jobs) and repairs drift, so a rollout stage ends at most this late;
    10 s is short next to a Job's duration and cheap (a handful of GETs per model)."""

    hot_buckets_interval_s: float = 300.0
    """Seconds between reads of each model's serving workers' bucket hits into its hot list, which
    worker pods started later (scaling, rescheduling) prewarm first (hot_buckets.py); 0 turns it off.
    Traffic's shapes move over minutes to hours, not seconds: 5 minutes keeps the list current for
    one small HTTP GET per pod (at most 8) per model."""

    pod_namespace: str = ""
    """The namespace the operator's pod runs in (the chart sets it from the downward API). The worker
    NetworkPolicies admit it to the workers' metrics port, where the hot list is read, also when
    `networkPolicy.metricsNamespaces` leaves it out; empty adds no such rule."""

    retry_delay_s: float = 15.0
    """Delay before retrying after a transient API error (conflict, throttling, server error)."""

    api_timeout_s: float = 30.0
    """Timeout of one API call, in seconds."""

    worker_image: str = "kembed/worker:0.1.0"
    """Worker image for models that name none. Part of the revision: changing it rolls those models
    out (gated like any other revision). The default is what `make images` tags locally (its default
    IMAGE_PREFIX, the package version), e.g. for a kind cluster; the chart always sets it, from its
    imagePrefix and imageTag."""

    gateway_image: str = "kembed/gateway:0.1.0"
    """Gateway image for models that name none (defaults as the worker's)."""

    health_port: int = 8081
    """Port of kopf's liveness endpoint (`/healthz`), which the chart's probe reads. 8081 by the
    convention of controller-runtime operators; tests running several operators on one host move it."""

    metrics_port: int = 9090
    """Port of the Prometheus metrics endpoint (`/metrics`, all addresses); 0 disables it. 9090 is the
    chart's `metrics.port` default (the chart passes its value here)."""

    log_level: str = "INFO"
    """Python log level name."""


def parse_settings(argv: Sequence[str], env: Mapping[str, str] = os.environ) -> OperatorSettings:
    parser = argparse.ArgumentParser(prog="python -m kembed.operator", description=__doc__.split("\n\n")[0])
    for field in fields(OperatorSettings):
        env_name = ENV_PREFIX + field.name.upper()
        raw = env.get(env_name)
        flag = "--" + field.name.replace("_", "-")
        if field.name == "namespaces":
            default = tuple(x.strip() for x in (raw or "").split(",") if x.strip())
            parser.add_argument(
                flag,
                "-n",
                dest="namespaces",
                action="append",
                default=None,
                help=f"repeatable [env {env_name}, comma-separated; default: all]",
            )
            parser.set_defaults(_namespaces_env=default)
        else:
            assert field.default is not MISSING, field.name  # every setting has a default
            kind = type(field.default)
            parser.add_argument(
                flag,
                type=kind,
                default=field.default if raw is None else kind(raw),
                help=f"[env {env_name}; default %(default)s]",
            )
    args = vars(parser.parse_args(argv))
    from_env = args.pop("_namespaces_env")
    args["namespaces"] = tuple(args["namespaces"]) if args["namespaces"] else from_env
    return OperatorSettings(**args)
