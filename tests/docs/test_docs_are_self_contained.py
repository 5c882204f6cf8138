"""README.md and docs/*.md stand on their own: every relative link and image, and every repository
path they name, resolves to a file in the repository (a `#heading` to a heading of its page); nothing
points outside it or to where the work was tracked; benchmarks are named by what they measure; the
operator's RBAC table lists exactly the rules the operator is granted
(operator/kembed_operator/cluster/rbac.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kembed.operator.cluster.rbac import CLUSTER_RBAC_RULES, RBAC_RULES

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP_LEVEL = ("docs", "tests", "worker", "gateway", "operator", "proto", "monitoring", "charts", "lab")

# `[text](target)` and `![alt](target)`; the text may run over lines.
LINK = re.compile(r"!?\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
# A path under one of the repository's top-level folders, as prose, code or a command names it.
REPO_PATH = re.compile(r"(?<![\w/.~-])(?P<path>(?:" + "|".join(TOP_LEVEL) + r")/[\w./-]*)")
FORBIDDEN = {
    "a path outside the repository": re.compile(r"\.\./shared|(?<![\w.])/work/|\bshared/[A-Z_]+\.md"),
    "an issue reference": re.compile(
        r"\bissues?\s*#?\d+|#\d{1,5}\b(?![\w-])|\bthe issue(?:'s)?\b|\bissue numbering\b", re.IGNORECASE
    ),
    "a reference to the working session": re.compile(r"\bthis session\b", re.IGNORECASE),
    "a benchmark named by number": re.compile(
        r"\bsuites? (?:\d+[a-z]?|[A-Z])\b|^\*\*(?:\d+[a-z]?|[A-Z])\. ", re.M
    ),
}


def doc_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    for line in without_code_blocks(path.read_text()).splitlines():
        if match := re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line):
            base = slug(match.group(1))
            anchor, n = base, 0
            while anchor in found:  # GitHub numbers repeated headings: name, name-1, name-2
                n += 1
                anchor = f"{base}-{n}"
            found.add(anchor)
    return found


def without_code_blocks(text: str) -> str:
    """The text with fenced code blocks blanked (their lines kept, so line numbers still hold)."""
    return re.sub(r"^```.*?^```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.M | re.S)


def prose(text: str) -> str:
    """The text without fenced blocks and inline code: where a Markdown link can be."""
    return re.sub(r"`[^`\n]*`", "", without_code_blocks(text))


def test_the_documents_are_found():
    assert {doc_id(path) for path in DOCS} >= {"README.md", "docs/operator.md", "docs/benchmarks.md"}


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_every_relative_link_resolves_inside_the_repository(doc: Path):
    problems = []
    for match in LINK.finditer(prose(doc.read_text())):
        target = match.group("target")
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (doc.parent / file_part).resolve() if file_part else doc
        if not resolved.is_relative_to(ROOT):
            problems.append(f"{target}: outside the repository")
        elif not resolved.exists():
            problems.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{target}: no heading #{anchor} in {doc_id(resolved)}")
    assert not problems, f"{doc_id(doc)}: {problems}"


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_every_repository_path_named_exists(doc: Path):
    missing = []
    text = doc.read_text()
    for match in REPO_PATH.finditer(text):
        path = match.group("path").rstrip(".")
        following = text[match.end() : match.end() + 1]
        if following in ("*", "{", "<") or "*" in path:  # a pattern, not a file
            continue
        if not (ROOT / path).exists():
            line = text.count("\n", 0, match.start()) + 1
            missing.append(f"line {line}: {path}")
    assert not missing, f"{doc_id(doc)} names files that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_nothing_points_outside_the_repository_or_to_the_work_tracking(doc: Path):
    text = doc.read_text()
    found = []
    for what, pattern in FORBIDDEN.items():
        for match in pattern.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append(f"line {line}: {what}: {match.group(0)!r}")
    assert not found, f"{doc_id(doc)}: {found}"


def rbac_section() -> str:
    text = (ROOT / "docs" / "operator.md").read_text()
    start = text.index("### RBAC")
    return text[start : text.index("\n## ", start)]


def documented_rules() -> dict[tuple[str, str], set[str]]:
    """(API group, resource) -> verbs, from the RBAC table of docs/operator.md."""
    rules: dict[tuple[str, str], set[str]] = {}
    for line in rbac_section().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].startswith("`"):
            continue
        group = cells[0].strip("`").strip('"')
        for resource in re.findall(r"`([^`]+)`", cells[1]):
            assert (group, resource) not in rules, f"{group}/{resource} is listed twice"
            rules[(group, resource)] = set(cells[2].split())
    return rules


def test_the_rbac_table_lists_exactly_the_operators_rules():
    granted = {
        (group, resource): set(rule["verbs"])
        for rule in RBAC_RULES
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    documented = documented_rules()
    assert set(granted) - set(documented) == set(), "granted, not in docs/operator.md's RBAC table"
    assert set(documented) - set(granted) == set(), "in docs/operator.md's RBAC table, not granted"
    assert {key: verbs for key, verbs in documented.items() if verbs != granted[key]} == {}, "verbs differ"


def test_the_cluster_wide_reads_are_named_with_their_verbs():
    section = rbac_section()
    for rule in CLUSTER_RBAC_RULES:
        for resource in rule["resources"]:
            assert f"`{resource}` {'/'.join(rule['verbs'])}" in " ".join(section.split()), resource
