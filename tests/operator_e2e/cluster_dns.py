"""Cluster DNS for a headless Service, answered from the API stand-in as CoreDNS answers from
EndpointSlices: `<svc>.<ns>.svc` stands for the IPs of the ready pods its selector picks, and for
none when it has no ready pod or does not exist (NXDOMAIN). A deleted pod is gone at once, as its
endpoint is marked terminating at deletion. Answered fresh at each lookup (CoreDNS would cache a
headless Service's records for up to 5 s).

The local kubelet asks once at a pod's start (`ready_pod_ips`, synchronous), the gateway pods at
each of their lookups (`resolve_service`, the gateway's `Resolve` port; gateway_entry.py).
"""

from __future__ import annotations

import re
from typing import Any

import httpx

from kembed.gateway.pool.replicas import resolve_dns

SERVICE_HOST = re.compile(r"\b([a-z0-9-]+)\.([a-z0-9-]+)\.svc(?:\.cluster\.local)?\b")


def selected_ready_ips(service: dict[str, Any], pods: list[dict[str, Any]]) -> list[str]:
    """The IPs of `pods` that `service`'s selector picks and that are Ready and not being deleted."""
    selector = service["spec"].get("selector") or {}
    return sorted(
        p["status"]["podIP"]
        for p in pods
        if selector
        and all(p["metadata"].get("labels", {}).get(k) == v for k, v in selector.items())
        and not p["metadata"].get("deletionTimestamp")
        and any(
            c["type"] == "Ready" and c["status"] == "True" for c in p.get("status", {}).get("conditions", [])
        )
    )


def ready_pod_ips(api: httpx.Client, service: str, namespace: str) -> list[str]:
    """What `<service>.<namespace>.svc` resolves to now."""
    answer = api.get(f"/api/v1/namespaces/{namespace}/services/{service}")
    if answer.status_code == 404:
        return []
    answer.raise_for_status()
    pods = api.get(f"/api/v1/namespaces/{namespace}/pods")
    pods.raise_for_status()
    return selected_ready_ips(answer.json(), pods.json()["items"])


async def resolve_service(api_url: str, host: str, port: int) -> list[str]:
    """The gateway's `Resolve` inside the stand-in: a Service name's ready pods as `ip:port` targets;
    any other name through the machine's DNS. An unreachable API is a failed lookup (OSError), which
    the gateway answers by keeping the replicas it knows."""
    match = SERVICE_HOST.fullmatch(host)
    if match is None:
        return await resolve_dns(host, port)
    service, namespace = match.groups()
    try:
        async with httpx.AsyncClient(base_url=api_url, timeout=5) as api:
            answer = await api.get(f"/api/v1/namespaces/{namespace}/services/{service}")
            if answer.status_code == 404:
                return []
            answer.raise_for_status()
            pods = await api.get(f"/api/v1/namespaces/{namespace}/pods")
            pods.raise_for_status()
    except httpx.HTTPError as error:
        raise OSError(f"the API stand-in did not answer for {host}: {error!r}") from error
    return [f"{ip}:{port}" for ip in selected_ready_ips(answer.json(), pods.json()["items"])]
