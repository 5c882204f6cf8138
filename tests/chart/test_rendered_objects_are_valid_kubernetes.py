"""Everything the chart renders, the CRD included, is valid for Kubernetes 1.31 and 1.35 (strict:
unknown fields and wrong types fail), carries the standard labels, and has a unique identity."""

import json

import kubernetes_validate
import pytest
import yaml
from chart_tools import CRD_FILE, NAMESPACE, RELEASE, run
from values_cases import VALUE_SETS

KUBERNETES_VERSIONS = ["1.31.0", "1.35.0"]

# Kinds of the Prometheus Operator's CRDs: kubernetes-validate has no schema for them (it would only
# warn). They are checked by shape in test_monitoring_hooks.py and test_prometheus_rule.py instead.
CUSTOM_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}

STANDARD_LABELS = {
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
}
CLUSTER_SCOPED_KINDS = {"ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}


def describe(doc: dict) -> str:
    return f"{doc['kind']}/{doc['metadata']['name']}"


@pytest.fixture(scope="module")
def rendered(helm_template) -> dict[str, list[dict]]:
    return {name: helm_template(values, "--include-crds") for name, values in VALUE_SETS.items()}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("value_set", VALUE_SETS.keys())
def test_every_rendered_object_is_valid(rendered, value_set, version):
    errors = []
    for doc in rendered[value_set]:
        if (doc["apiVersion"], doc["kind"]) in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(part) for part in error.path) or "(top)"
            errors.append(f"{describe(doc)} at {path}: {error.message}")
        except kubernetes_validate.SchemaNotFoundError:
            errors.append(f"{describe(doc)}: no schema for {doc['apiVersion']} {doc['kind']} in {version}")
    assert not errors, "\n".join(errors)


def test_chart_ships_the_generated_crd_verbatim(rendered):
    """The CRD comes from kembed.operator's typed spec (its own test keeps the file fresh); the chart
    installs exactly that file."""
    assert CRD_FILE.is_file(), f"{CRD_FILE} is missing: generate it from kembed.operator's spec"
    crd = yaml.safe_load(CRD_FILE.read_text())
    assert crd["metadata"]["name"] == "embeddingmodels.kembed.dev"
    crds = [doc for doc in rendered["defaults"] if doc["kind"] == "CustomResourceDefinition"]
    assert crds == [crd]


@pytest.mark.parametrize("value_set", VALUE_SETS.keys())
def test_every_object_carries_the_standard_labels(rendered, value_set):
    for doc in rendered[value_set]:
        if doc["kind"] == "CustomResourceDefinition":
            continue  # Helm installs crds/ as is, never templated
        labels = doc["metadata"].get("labels", {})
        assert labels.keys() >= STANDARD_LABELS, f"{describe(doc)} lacks {STANDARD_LABELS - labels.keys()}"
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/managed-by"] == "Helm"


@pytest.mark.parametrize("value_set", VALUE_SETS.keys())
def test_namespaced_objects_name_their_namespace_and_identities_are_unique(rendered, value_set):
    """`helm template | kubectl apply -f -` must land every object where the release would."""
    seen = set()
    for doc in rendered[value_set]:
        namespace = doc["metadata"].get("namespace")
        if doc["kind"] in CLUSTER_SCOPED_KINDS:
            assert namespace is None, describe(doc)
        else:
            assert namespace, f"{describe(doc)} names no namespace"
        identity = (doc["apiVersion"], doc["kind"], namespace, doc["metadata"]["name"])
        assert identity not in seen, f"{identity} rendered twice"
        seen.add(identity)


def test_kustomize_accepts_the_rendered_chart(k8s_tools, tmp_path, helm_template):
    """The GitOps path `helm template | kustomize` (Argo CD, Flux): kubectl's kustomize reads every
    object and re-emits it unchanged apart from the overlay's label. (kustomize's own helmCharts
    inflation cannot drive helm 4 yet: it calls `helm version -c`, a flag helm 4 removed.)"""
    docs = helm_template(VALUE_SETS["customised"], "--include-crds")
    (tmp_path / "rendered.yaml").write_text(yaml.safe_dump_all(docs))
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump({"resources": ["rendered.yaml"], "labels": [{"pairs": {"overlay": "test"}}]})
    )
    done = run([k8s_tools.kubectl, "kustomize", tmp_path])
    assert done.returncode == 0, done.stderr
    out = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    assert len(out) == len(docs)
    for doc in out:
        labels = doc["metadata"]["labels"]
        assert labels.pop("overlay") == "test"
        if not labels:
            del doc["metadata"]["labels"]
    key = lambda doc: json.dumps([doc["kind"], doc["metadata"].get("namespace"), doc["metadata"]["name"]])  # noqa: E731
    assert sorted(out, key=key) == sorted(docs, key=key)
    assert NAMESPACE in {doc["metadata"].get("namespace") for doc in out}


def test_validation_catches_a_misspelt_field_passed_through_values(helm_template):
    """The schema lets EnvVar objects through as they are; strict validation is what catches them."""
    docs = helm_template({"operator": {"extraEnv": [{"name": "HTTPS_PROXY", "valeu": "http://proxy:3128"}]}})
    [deployment] = [doc for doc in docs if doc["kind"] == "Deployment"]
    with pytest.raises(kubernetes_validate.ValidationError, match="'valeu' was unexpected"):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[0], strict=True)
