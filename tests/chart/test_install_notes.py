"""What `helm install` prints afterwards: where EmbeddingModels go and how to reach the gateway.
(`helm install --dry-run=client` renders NOTES.txt without a cluster; `helm template` does not.)"""

import json

import pytest
from chart_tools import CHART_DIR, NAMESPACE, RELEASE, run
from values_cases import CLUSTER_WIDE, REQUIRED, TWO_NAMESPACES


def notes(k8s_tools, tmp_path, values: dict) -> str:
    values_file = tmp_path / "values.json"
    values_file.write_text(json.dumps({**REQUIRED, **values}))
    done = run(
        [
            k8s_tools.helm,
            "install",
            RELEASE,
            CHART_DIR,
            "--dry-run=client",
            "--namespace",
            NAMESPACE,
            "--values",
            values_file,
        ]
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split("NOTES:", 1)[1]


@pytest.mark.parametrize(
    ("values", "scope", "apply_in"),
    [
        ({}, f"EmbeddingModels in {NAMESPACE}.", NAMESPACE),
        (CLUSTER_WIDE, "EmbeddingModels in every namespace.", NAMESPACE),
        (TWO_NAMESPACES, "EmbeddingModels in search, recommendations.", "search"),
    ],
    ids=["release-namespace", "cluster-wide", "two-namespaces"],
)
def test_notes_say_where_to_apply_a_model_and_how_to_reach_its_gateway(
    k8s_tools, tmp_path, values, scope, apply_in
):
    text = notes(k8s_tools, tmp_path, values)
    assert scope in text
    assert f"kubectl -n {apply_in} apply -f charts/kembed/examples/" in text
    assert f"kubectl -n {apply_in} wait embeddingmodel/<name> --for=condition=Ready" in text
    assert "{.status.gatewayURL}" in text
    assert f"kubectl -n {NAMESPACE} rollout status deployment/{RELEASE}" in text
