"""The operator's RBAC: a Role per watched namespace by default, a ClusterRole only when asked, and
in either case exactly what the operator declares it uses (kembed.operator.cluster.rbac.RBAC_RULES) plus what
kopf itself needs, nothing broader."""

import pytest
from chart_tools import NAMESPACE, find
from values_cases import CLUSTER_WIDE, TWO_NAMESPACES

from kembed.operator.cluster.rbac import CLUSTER_RBAC_RULES, RBAC_RULES

Grant = tuple[str, str, str]  # (apiGroup, resource, verb)


def grants(rules: list[dict]) -> set[Grant]:
    """PolicyRules as (apiGroup, resource, verb) triples, so that how rules are grouped never matters."""
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


DECLARED = grants(RBAC_RULES)
# What kopf itself does in a namespace, running --standalone (no kopfpeerings): lists and watches the
# resource it serves, patches it and its status (finalizers, progress annotations), posts Events.
KOPF_NAMESPACED = {
    ("kembed.dev", "embeddingmodels", "list"),
    ("kembed.dev", "embeddingmodels", "watch"),
    ("kembed.dev", "embeddingmodels", "patch"),
    ("kembed.dev", "embeddingmodels/status", "patch"),
    ("", "events", "create"),
}
# Cluster-wide only (kopf/_core/reactor/observation.py): it watches CRDs to notice resources
# appearing (list + watch, never get), and lists and watches namespaces only when it is given names
# rather than all namespaces. Under a Role it logs that it lacks these and falls back.
KOPF_CRDS = {("apiextensions.k8s.io", "customresourcedefinitions", verb) for verb in ("list", "watch")}
KOPF_NAMESPACES = {("", "namespaces", verb) for verb in ("list", "watch")}


def test_operator_declares_everything_kopf_needs_in_a_namespace():
    assert KOPF_NAMESPACED <= DECLARED


def test_default_install_grants_a_role_in_the_release_namespace_only(helm_template):
    docs = helm_template()
    assert not find(docs, "ClusterRole") and not find(docs, "ClusterRoleBinding")
    [role] = find(docs, "Role")
    [binding] = find(docs, "RoleBinding")
    [account] = find(docs, "ServiceAccount")
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == NAMESPACE
    assert grants(role["rules"]) == DECLARED | KOPF_NAMESPACED
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": NAMESPACE}
    ]


def test_each_watched_namespace_gets_its_own_role_and_binding(helm_template):
    docs = helm_template(TWO_NAMESPACES)
    watched = set(TWO_NAMESPACES["operator"]["watchNamespaces"])
    assert {role["metadata"]["namespace"] for role in find(docs, "Role")} == watched
    assert {binding["metadata"]["namespace"] for binding in find(docs, "RoleBinding")} == watched
    for role in find(docs, "Role"):
        assert grants(role["rules"]) == DECLARED | KOPF_NAMESPACED
    for binding in find(docs, "RoleBinding"):
        # The ServiceAccount stays in the release namespace; each binding reaches back to it.
        assert binding["subjects"][0]["namespace"] == NAMESPACE
    assert not find(docs, "ClusterRole")


def test_cluster_wide_grants_a_cluster_role_with_what_kopf_needs_cluster_wide(helm_template):
    docs = helm_template(CLUSTER_WIDE)
    assert not find(docs, "Role") and not find(docs, "RoleBinding")
    [role] = find(docs, "ClusterRole")
    [binding] = find(docs, "ClusterRoleBinding")
    # Watching every namespace, kopf never lists namespaces: no grant for them.
    assert grants(role["rules"]) == DECLARED | KOPF_NAMESPACED | KOPF_CRDS
    assert binding["roleRef"]["kind"] == "ClusterRole"
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"][0]["namespace"] == NAMESPACE


def test_cluster_wide_with_named_namespaces_lets_kopf_follow_namespaces(helm_template):
    [role] = find(helm_template({**CLUSTER_WIDE, **TWO_NAMESPACES}), "ClusterRole")
    assert grants(role["rules"]) == DECLARED | KOPF_NAMESPACED | KOPF_CRDS | KOPF_NAMESPACES


def test_cluster_grants_stay_within_what_the_operator_declares_for_cluster_scope(helm_template):
    declared = DECLARED | grants(CLUSTER_RBAC_RULES)
    for values in (CLUSTER_WIDE, {**CLUSTER_WIDE, **TWO_NAMESPACES}):
        [role] = find(helm_template(values), "ClusterRole")
        assert grants(role["rules"]) <= declared


@pytest.mark.parametrize("values", [{}, CLUSTER_WIDE], ids=["namespaced", "cluster-wide"])
def test_nothing_broader_than_named_resources_is_granted(helm_template, values):
    docs = helm_template(values)
    for role in find(docs, "Role") + find(docs, "ClusterRole"):
        for group, resource, verb in grants(role["rules"]):
            assert "*" not in (group, resource, verb)
            assert resource not in {"secrets", "roles", "rolebindings", "clusterroles", "clusterrolebindings"}
            assert verb not in {"escalate", "bind", "impersonate", "deletecollection"}


def test_rbac_create_false_renders_no_rbac_and_existing_account_is_used(helm_template):
    docs = helm_template({"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "prepared"}})
    assert not [doc for doc in docs if doc["apiVersion"].startswith("rbac.authorization.k8s.io")]
    assert not find(docs, "ServiceAccount")
    [deployment] = find(docs, "Deployment")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "prepared"
