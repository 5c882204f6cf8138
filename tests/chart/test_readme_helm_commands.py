"""The README's helm commands, with their flags exactly as written there (read from it, so the two
cannot drift), render through `helm template`: a user who copies them gets no schema error."""

from __future__ import annotations

import re
import shlex

import pytest
from chart_tools import REPO_ROOT, parse_documents, run

BLOCK = re.compile(r"```bash\n(.*?)```", re.S)


def readme_helm_commands() -> list[list[str]]:
    """Every `helm install` / `helm upgrade --install` in the README's bash blocks, continuation
    lines joined, comments dropped, as argument lists."""
    commands = []
    for block in BLOCK.findall((REPO_ROOT / "README.md").read_text()):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == ["helm"] and words[1:2] in (["install"], ["upgrade"]):
                commands.append(words)
    return commands


COMMANDS = readme_helm_commands()


def test_the_readme_has_its_helm_commands():
    assert len(COMMANDS) >= 2, COMMANDS  # the install and the monitoring upgrade


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
