"""Opt-in monitoring: a metrics Service with a ServiceMonitor or PodMonitor that select it, and the
Grafana dashboards (a sidecar-labelled ConfigMap per dashboards/*.json)."""

import json

from chart_tools import CHART_DIR, NAMESPACE, find
from values_cases import CUSTOMISED


def test_monitoring_is_off_by_default(helm_template):
    docs = helm_template()
    assert {doc["kind"] for doc in docs} == {"ServiceAccount", "Role", "RoleBinding", "Deployment"}


def test_service_monitor_scrapes_the_operators_metrics_port(helm_template):
    docs = helm_template(CUSTOMISED)
    [service] = find(docs, "Service")
    [monitor] = find(docs, "ServiceMonitor")
    [deployment] = find(docs, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]

    assert service["spec"]["selector"].items() <= pod_labels.items()
    [port] = service["spec"]["ports"]
    assert port["targetPort"] in {p["name"] for p in container["ports"]}
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint == {"port": port["name"], "path": "/metrics", "interval": "15s", "scrapeTimeout": "10s"}
    # The label a kube-prometheus-stack Prometheus selects monitors by.
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_pod_monitor_selects_the_operator_pod(helm_template):
    docs = helm_template(CUSTOMISED)
    [monitor] = find(docs, "PodMonitor")
    [deployment] = find(docs, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"


def test_each_shipped_dashboard_becomes_a_configmap_the_grafana_sidecar_loads(helm_template):
    files = sorted((CHART_DIR / "dashboards").glob("*.json"))
    assert len(files) >= 6, "latency, pinned memory, graph cache, batching, throughput/errors, rollouts"
    configmaps = {cm["metadata"]["name"]: cm for cm in find(helm_template(CUSTOMISED), "ConfigMap")}
    assert len(configmaps) == len(files)
    for path in files:
        configmap = configmaps[f"embeddings-operator-dashboard-{path.stem}"]
        assert configmap["metadata"]["namespace"] == "monitoring"
        assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert configmap["data"] == {path.name: path.read_text().rstrip("\n")}
        assert json.loads(configmap["data"][path.name])["uid"] == path.stem


def test_the_operator_serves_metrics_on_the_port_the_chart_declares(helm_template):
    def operator(docs):
        [deployment] = find(docs, "Deployment")
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        return env, {p["name"]: p["containerPort"] for p in container["ports"]}

    env, ports = operator(helm_template(CUSTOMISED))
    assert env["KEMBED_OPERATOR_METRICS_PORT"] == str(ports["metrics"])
    env, ports = operator(helm_template())
    assert env["KEMBED_OPERATOR_METRICS_PORT"] == "0" and "metrics" not in ports
