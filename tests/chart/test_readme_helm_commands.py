"""The helm commands of the README and docs/operator.md, with their flags exactly as written there
(read from them, so the two cannot drift), render through `helm template`: a user who copies them gets
no schema error and no missing value (the chart needs imagePrefix)."""

from __future__ import annotations

import re
import shlex

import pytest
from chart_tools import REPO_ROOT, parse_documents, run

BLOCK = re.compile(r"```bash\n(.*?)```", re.S)
DOCS = ("README.md", "docs/operator.md")


def helm_commands(doc: str) -> list[list[str]]:
    """Every `helm install` / `helm upgrade --install` in a document's bash blocks (indented ones in a
    list item too), continuation lines joined, comments dropped, as argument lists."""
    commands = []
    for block in BLOCK.findall((REPO_ROOT / doc).read_text()):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == ["helm"] and words[1:2] in (["install"], ["upgrade"]):
                commands.append(words)
    return commands


COMMANDS = [command for doc in DOCS for command in helm_commands(doc)]


def test_the_readme_has_its_helm_commands():
    assert len(helm_commands("README.md")) >= 2, COMMANDS  # the install and the monitoring upgrade


def test_the_operator_guide_has_its_install_commands():
    commands = helm_commands("docs/operator.md")
    assert len(commands) >= 2, commands  # the install, and the install on OpenShift
    assert all(any(word.startswith("imagePrefix=") for word in command) for command in commands)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:3]))
def test_each_readme_helm_command_renders(k8s_tools, command):
    # `helm install NAME CHART ...` and `helm upgrade --install NAME CHART ...` as `helm template`
    flags = [word for word in command[2:] if word != "--install"]
    done = run([k8s_tools.helm, "template", *flags])
    assert done.returncode == 0, done.stderr
    kinds = {doc["kind"] for doc in parse_documents(done.stdout)}
    assert "Deployment" in kinds  # the operator
    if any("prometheusRule.enabled=true" in word for word in command):
        assert "PrometheusRule" in kinds
    if any("podSecurityContext.runAsUser=null" in word for word in command):  # the OpenShift install
        (operator,) = [d for d in parse_documents(done.stdout) if d["kind"] == "Deployment"]
        security = operator["spec"]["template"]["spec"]["securityContext"]
        assert {"runAsUser", "runAsGroup", "fsGroup"}.isdisjoint(security) and security["runAsNonRoot"]
