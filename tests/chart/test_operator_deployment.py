"""The operator Deployment: hardened, a single replica, its settings taken from values, its image and
the default images it gives EmbeddingModels derived from one prefix, and every setting the chart
passes known to the operator itself."""

import os
import re
import subprocess
import sys

import pytest
from chart_tools import CHART_DIR, NAMESPACE, RELEASE, REPO_ROOT, find, run
from values_cases import CLUSTER_WIDE, CUSTOMISED, TWO_NAMESPACES


def operator_pod(docs: list[dict]) -> dict:
    [deployment] = find(docs, "Deployment")
    return deployment["spec"]["template"]["spec"]


def operator_env(docs: list[dict]) -> dict[str, str]:
    [container] = operator_pod(docs)["containers"]
    return {var["name"]: var.get("value") for var in container["env"]}


def test_operator_runs_as_non_root_on_a_read_only_root_without_capabilities(helm_template):
    pod = operator_pod(helm_template())
    [container] = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    # Requests always (the scheduler needs them) and a memory limit (a leak must not take the node).
    assert {"cpu", "memory"} <= container["resources"]["requests"].keys()
    assert "memory" in container["resources"]["limits"]
    # A read-only root still needs a writable /tmp for Python.
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]


def test_operator_is_one_replica_replaced_never_doubled(helm_template):
    """kopf runs --standalone: two operator pods at once would both act on every EmbeddingModel."""
    [deployment] = find(helm_template(CUSTOMISED), "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


def test_operator_runs_the_package_module(helm_template):
    [container] = operator_pod(helm_template())["containers"]
    assert container["command"] == ["python", "-P", "-m", "kembed.operator"]
    assert container["image"] == "registry.test/kembed/operator:0.1.0"  # imagePrefix, appVersion
    # kembed.operator's __main__ serves kopf's liveness endpoint on 8081.
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {"name": "health", "containerPort": 8081, "protocol": "TCP"} in container["ports"]


def test_default_settings_watch_the_release_namespace_with_default_images(helm_template):
    env = operator_env(helm_template())
    assert env["KEMBED_OPERATOR_NAMESPACES"] == NAMESPACE
    assert env["KEMBED_OPERATOR_WORKER_IMAGE"] == "registry.test/kembed/worker:0.1.0"
    assert env["KEMBED_OPERATOR_GATEWAY_IMAGE"] == "registry.test/kembed/gateway:0.1.0"


def images(docs: list[dict]) -> tuple[str, str, str]:
    [container] = operator_pod(docs)["containers"]
    env = operator_env(docs)
    return container["image"], env["KEMBED_OPERATOR_WORKER_IMAGE"], env["KEMBED_OPERATOR_GATEWAY_IMAGE"]


def test_one_prefix_and_tag_name_all_three_images(helm_template):
    """`make images push IMAGE_PREFIX=P IMAGE_TAG=T` then `--set imagePrefix=P --set imageTag=T`: the
    operator runs P/operator:T and gives models P/worker:T and P/gateway:T."""
    docs = helm_template({"imagePrefix": "my.registry:5000/team/", "imageTag": "v2"})
    assert images(docs) == (
        "my.registry:5000/team/operator:v2",
        "my.registry:5000/team/worker:v2",
        "my.registry:5000/team/gateway:v2",
    )


def test_an_image_of_its_own_overrides_the_prefix_for_that_image_only(helm_template):
    docs = helm_template(
        {
            "imagePrefix": "my.registry/team",
            "defaultImages": {"worker": {"repository": "other.registry/kembed-worker-cu130", "tag": "cu130"}},
            "operator": {"image": {"digest": "sha256:" + "ef" * 32}},
        }
    )
    assert images(docs) == (
        "my.registry/team/operator@sha256:" + "ef" * 32,
        "other.registry/kembed-worker-cu130:cu130",
        "my.registry/team/gateway:0.1.0",
    )


@pytest.mark.parametrize("given", ["none", "operator-only"])
def test_without_an_image_prefix_the_install_fails_saying_what_to_set(k8s_tools, given):
    """kembed publishes no images: a default pointing at a registry would install an operator that
    never pulls (or, worse, pulls whatever someone else pushed there)."""
    extra = ["--set", "operator.image.repository=my.registry/op"] if given == "operator-only" else []
    done = run([k8s_tools.helm, "template", RELEASE, CHART_DIR, "--namespace", NAMESPACE, *extra])
    assert done.returncode != 0
    assert "imagePrefix is not set" in done.stderr and "make images push IMAGE_PREFIX=" in done.stderr
    missing = "defaultImages.worker.repository" if given == "operator-only" else "operator.image.repository"
    assert f"or set {missing}" in done.stderr, done.stderr


def test_every_image_named_needs_no_prefix(k8s_tools):
    repositories = [
        "--set=operator.image.repository=r.example/op",
        "--set=defaultImages.worker.repository=r.example/w",
        "--set=defaultImages.gateway.repository=r.example/g",
    ]
    done = run([k8s_tools.helm, "template", RELEASE, CHART_DIR, "--namespace", NAMESPACE, *repositories])
    assert done.returncode == 0, done.stderr


def test_watch_scope_follows_rbac_scope(helm_template):
    """Empty means every namespace to the operator: only ever rendered with the ClusterRole."""
    assert operator_env(helm_template(CLUSTER_WIDE))["KEMBED_OPERATOR_NAMESPACES"] == ""
    named = operator_env(helm_template(TWO_NAMESPACES))
    assert named["KEMBED_OPERATOR_NAMESPACES"] == "search,recommendations"
    named_cluster_wide = operator_env(helm_template({**CLUSTER_WIDE, **TWO_NAMESPACES}))
    assert named_cluster_wide["KEMBED_OPERATOR_NAMESPACES"] == "search,recommendations"


def test_customised_values_reach_the_pod(helm_template):
    docs = helm_template(CUSTOMISED)
    pod = operator_pod(docs)
    [container] = pod["containers"]
    env = operator_env(docs)
    # A digest pins the image; the tag is then only informative.
    assert container["image"] == "registry.example.com/ml/kembed-operator@sha256:" + "ab" * 32
    assert container["imagePullPolicy"] == "Always"
    assert pod["imagePullSecrets"] == [{"name": "registry-credentials"}]
    assert pod["serviceAccountName"] == "embeddings"
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["tolerations"] == CUSTOMISED["operator"]["tolerations"]
    assert pod["affinity"] == CUSTOMISED["operator"]["affinity"]
    assert container["resources"] == CUSTOMISED["operator"]["resources"]
    assert {"name": "metrics", "containerPort": 9100, "protocol": "TCP"} in container["ports"]
    assert env["KEMBED_OPERATOR_RECONCILE_INTERVAL_S"] == "2.5"
    assert env["KEMBED_OPERATOR_RETRY_DELAY_S"] == "30"
    assert env["KEMBED_OPERATOR_API_TIMEOUT_S"] == "60"
    assert env["KEMBED_OPERATOR_LOG_LEVEL"] == "DEBUG"
    assert env["KEMBED_OPERATOR_WORKER_IMAGE"] == "registry.example.com/ml/kembed-worker:0.1.0-cu128"
    assert (
        env["KEMBED_OPERATOR_GATEWAY_IMAGE"] == "registry.example.com/ml/kembed-gateway@sha256:" + "cd" * 32
    )
    assert env["HTTPS_PROXY"] == "http://proxy.example.com:3128"
    [deployment] = find(docs, "Deployment")
    assert deployment["metadata"]["name"] == "embeddings-operator"
    assert deployment["metadata"]["labels"]["team"] == "search"
    assert deployment["spec"]["template"]["metadata"]["labels"]["tier"] == "control-plane"
    assert deployment["spec"]["template"]["metadata"]["annotations"] == {"example.com/owner": "search"}


def test_every_setting_the_chart_passes_is_one_the_operator_reads(helm_template):
    """The chart speaks to the operator through KEMBED_OPERATOR_* variables; `python -m kembed.operator
    --help` lists the ones it reads. A renamed setting fails here, not silently in a cluster."""
    passed = {name for name in operator_env(helm_template(CUSTOMISED)) if name.startswith("KEMBED_OPERATOR_")}
    done = subprocess.run(
        [sys.executable, "-P", "-m", "kembed.operator", "--help"],
        cwd=REPO_ROOT,
        env={**os.environ, "COLUMNS": "200"},  # argparse wraps help at the terminal width
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"python -m kembed.operator --help failed:\n{done.stderr[-3000:]}"
    known = set(re.findall(r"KEMBED_OPERATOR_[A-Z0-9_]+", done.stdout))
    assert passed <= known, f"the operator does not read {sorted(passed - known)}"


def test_the_operator_knows_its_namespace_and_the_hot_list_interval(helm_template):
    [container] = operator_pod(helm_template())["containers"]
    env = {var["name"]: var for var in container["env"]}
    assert env["KEMBED_OPERATOR_POD_NAMESPACE"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.namespace"}
    }
    assert env["KEMBED_OPERATOR_HOT_BUCKETS_INTERVAL_S"]["value"] == "300"
    off = operator_env(helm_template({"operator": {"hotBucketsIntervalSeconds": 0}}))
    assert off["KEMBED_OPERATOR_HOT_BUCKETS_INTERVAL_S"] == "0"
