"""Values the chart is rendered with in the tests: the defaults and deliberately non-default sets."""

# What every install must say (kembed publishes no images): where `make images push` put them. The
# tests render the chart with it unless a test is about its absence.
REQUIRED = {"imagePrefix": "registry.test/kembed"}

DEFAULTS: dict = {}

CLUSTER_WIDE = {"rbac": {"clusterWide": True}}

# Everything switched away from its default at once: cluster-wide RBAC for two named namespaces,
# monitors, alerts and dashboards on, custom images (by digest too), resources, scheduling, extra env,
# labels.
CUSTOMISED = {
    "fullnameOverride": "embeddings-operator",
    "commonLabels": {"team": "search"},
    "operator": {
        "image": {
            "repository": "registry.example.com/ml/kembed-operator",
            "tag": "0.1.0-rc1",
            "digest": "sha256:" + "ab" * 32,
            "pullPolicy": "Always",
        },
        "imagePullSecrets": [{"name": "registry-credentials"}],
        "watchNamespaces": ["search", "recommendations"],
        "reconcileIntervalSeconds": 2.5,
        "retryDelaySeconds": 30,
        "apiTimeoutSeconds": 60,
        "logLevel": "DEBUG",
        "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy.example.com:3128"}],
        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"cpu": 1, "memory": "1Gi"}},
        "podAnnotations": {"example.com/owner": "search"},
        "podLabels": {"tier": "control-plane"},
        "priorityClassName": "system-cluster-critical",
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}
                            ]
                        }
                    ]
                }
            }
        },
    },
    "defaultImages": {
        "worker": {"repository": "registry.example.com/ml/kembed-worker", "tag": "0.1.0-cu128"},
        "gateway": {"repository": "registry.example.com/ml/kembed-gateway", "digest": "sha256:" + "cd" * 32},
    },
    "serviceAccount": {"create": True, "name": "embeddings", "annotations": {"example.com/role": "ml"}},
    "rbac": {"create": True, "clusterWide": True},
    "metrics": {
        "enabled": True,
        "port": 9100,
        "serviceMonitor": {
            "enabled": True,
            "interval": "15s",
            "labels": {"release": "kube-prometheus-stack"},
        },
        "podMonitor": {"enabled": True},
    },
    "prometheusRule": {
        "enabled": True,
        "namespace": "monitoring",
        "labels": {"release": "kube-prometheus-stack"},
        "thresholds": {
            "latencyP99Seconds": 0.25,
            "pinnedMemoryFraction": 0.8,
            "coldHitFraction": 0.05,
            "serverErrorFraction": 0.01,
        },
    },
    "grafana": {"dashboards": {"enabled": True, "namespace": "monitoring"}},
    "networkPolicy": {
        "enabled": True,
        "apiServer": {"cidrs": ["10.0.0.1/32", "fd00::1/128"], "ports": [6443]},
        "dns": False,
        "metricsNamespaces": ["monitoring"],
        "extraEgress": [{"to": [{"ipBlock": {"cidr": "10.9.0.10/32"}}], "ports": [{"port": 3128}]}],
    },
}

# The operator's NetworkPolicy at its defaults, in a namespaced install (one Role per namespace).
NETWORK_POLICY = {"networkPolicy": {"enabled": True}}

# Namespaced RBAC (the default) for two watched namespaces: a Role and RoleBinding in each.
TWO_NAMESPACES = {"operator": {"watchNamespaces": ["search", "recommendations"]}}

VALUE_SETS = {
    "defaults": DEFAULTS,
    "cluster-wide": CLUSTER_WIDE,
    "two-namespaces": TWO_NAMESPACES,
    "customised": CUSTOMISED,
    "network-policy": NETWORK_POLICY,
}
