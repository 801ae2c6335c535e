"""The settings reference (docs/reference/settings.md) as data: per table, variable -> default.

Read by tests/common/test_settings.py (the tables against the declarations) and
tests/deploy/test_k8s.py (the tables against what the manifests set).
"""

from __future__ import annotations

import re

from tests.support import paths

SETTINGS_DOC = paths.REPO / "docs" / "reference" / "settings.md"


def documented_settings() -> dict[str, dict[str, str]]:
    """Per `## ` heading, each table row's variables and their defaults as written
    (backticks dropped; a row may name several: `A` / `B` with `1` / `2`)."""
    tables: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in SETTINGS_DOC.read_text().splitlines():
        if line.startswith("## "):
            current = tables.setdefault(line[3:].strip(), {})
        elif current is not None and line.startswith("| `"):
            cells = line.split("|")
            names = re.findall(r"`([A-Z][A-Z0-9_]*)`", cells[1])
            defaults = [d.strip().strip("`") for d in cells[2].split(" / ")]
            assert len(names) == len(defaults), f"names and defaults differ in count: {line}"
            for name, default in zip(names, defaults, strict=True):
                assert name not in current, f"{name} is documented twice"
                current[name] = default
    return tables
