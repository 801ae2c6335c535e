"""The docs hold together: every relative link resolves, and the RPC tables are complete.

Links are checked in README.md and every Markdown file under docs/, src/, client/ and k8s/: the
file a relative link names exists, and an `#anchor` into a Markdown file names one of its
headings (GitHub's slugs). The reference tables of docs/reference/ name every RPC of each
service exactly once, so a row cannot go missing or land outside its table unnoticed.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from urllib.parse import unquote

import pytest
from google.protobuf.descriptor import ServiceDescriptor

from agentstate.agent.v1 import agent_service_pb2
from agentstate.state.v1 import state_service_pb2
from tests.support import paths

REPO = paths.REPO
DOCS = [
    REPO / "README.md",
    *sorted(p for root in ("docs", "src", "client", "k8s") for p in (REPO / root).rglob("*.md")),
]
# [text](target) and ![alt](target), with an optional "title".
LINK = re.compile(r"!?\[[^\]]*\]\(\s*([^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.DOTALL | re.MULTILINE)
INLINE_CODE = re.compile(r"`[^`\n]*`")
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def prose(path: Path) -> str:
    """The text without code blocks and code spans, where brackets are not links."""
    return INLINE_CODE.sub("", FENCE.sub("", path.read_text()))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: Counter[str] = Counter()
    found = set()
    for line in FENCE.sub("", path.read_text()).splitlines():
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            base = slug(match.group(1))
            found.add(base if not seen[base] else f"{base}-{seen[base]}")
            seen[base] += 1
    return found


def broken_links(path: Path) -> list[str]:
    broken = []
    for target in LINK.findall(prose(path)):
        if SCHEME.match(target):
            continue  # a web address: not checked offline
        file_part, _, anchor = unquote(target).partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: {resolved.name} has no heading #{anchor}")
    return broken


def test_the_docs_are_found() -> None:
    names = {str(p.relative_to(REPO)) for p in DOCS}
    assert {"README.md", "docs/architecture.md", "docs/reference/settings.md"} <= names


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(path: Path) -> None:
    assert broken_links(path) == []


def test_the_link_check_sees_a_broken_link_and_a_broken_anchor(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## The `state` and its *parts*\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\n"
        "[fine](other.md#the-state-and-its-parts) [self](#title) [web](https://example.org)\n"
        "[gone](missing.md) [no heading](other.md#nowhere)\n"
        "`[code](not-a-link.md)`\n\n```\n[fenced](not-a-link-either.md)\n```\n"
    )
    assert broken_links(page) == [
        "missing.md: no such file",
        "other.md#nowhere: other.md has no heading #nowhere",
    ]


def rpc_table(path: Path) -> list[str]:
    """The RPC names in the first column of the page's first table headed `| RPC |`."""
    rows = path.read_text().split("\n| RPC |", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    return [name for row in rows for name in re.findall(r"`([A-Za-z]+)`", row.split("|")[1])]


@pytest.mark.parametrize(
    ("page", "service"),
    [
        ("state-rpcs.md", state_service_pb2.DESCRIPTOR.services_by_name["StateService"]),
        ("agent-rpcs.md", agent_service_pb2.DESCRIPTOR.services_by_name["AgentService"]),
    ],
    ids=["StateService", "AgentService"],
)
def test_the_rpc_reference_names_every_rpc_once(page: str, service: ServiceDescriptor) -> None:
    documented = rpc_table(REPO / "docs" / "reference" / page)
    twice = sorted(name for name, count in Counter(documented).items() if count > 1)
    assert twice == [], f"documented more than once: {twice}"
    assert sorted(documented) == sorted(m.name for m in service.methods)
