"""`kembed-gateway` as the local kubelet runs it: `python -m kembed.gateway`, except that the worker
Service's name is resolved by the stand-in's cluster DNS (cluster_dns.py) at each lookup, as a pod's
resolver asks CoreDNS, instead of by the machine's resolver, which knows no `*.svc` names.

Flags and environment are parsed by the gateway's own `parse_config`; the stand-in's API address
comes in LOCAL_KUBELET_API_URL, which the gateway does not read.
"""

from __future__ import annotations

import functools
import logging
import os
import sys

from cluster_dns import resolve_service

from kembed.gateway.__main__ import parse_config
from kembed.gateway.edge.processes import LOG_FORMAT, serve

API_URL_ENV = "LOCAL_KUBELET_API_URL"


def main() -> None:
    config = parse_config(sys.argv[1:], os.environ)
    logging.basicConfig(level=config.log_level.upper(), format=LOG_FORMAT)
    logging.getLogger(__name__).info("starting gateway (stand-in cluster DNS): %s", config)
    # A partial of a module-level function: with processes > 1 it is pickled into each spawned child.
    serve(config, resolve=functools.partial(resolve_service, os.environ[API_URL_ENV]))


if __name__ == "__main__":
    main()
