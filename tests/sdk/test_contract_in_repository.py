"""The contract is in the repository (issue 54): no file of README, docs, tests, the package,
the dashboards, rules or manifests needs what lies beside a checkout (``../shared``, its
design page); the design and the checklist are docs/design.md."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: what a clone holds that people and tools read: prose, code, rules, manifests
GLOBS = ("README.md", "CHANGELOG.md", "docs/**/*.md", "otel_train/**/*.py", "tests/**/*.py",
         "dashboards/**/*.py", "prometheus/**/*.yml", "k8s/**/*.yaml", "scripts/*.sh",
         ".ci/*")
#: the two ways a file reached outside: the folder beside the checkout, its design page
OUTSIDE = re.compile("\\.\\./" + "shared|DESIGN" + "\\.md")


def test_nothing_in_the_repository_points_outside_it() -> None:
    found = []
    for pattern in GLOBS:
        for path in REPO.glob(pattern):
            if not path.is_file() or path.name == Path(__file__).name:
                continue
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if OUTSIDE.search(line):
                    found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()[:80]}")
    assert found == []


def test_the_design_page_holds_the_checklist() -> None:
    design = (REPO / "docs" / "design.md").read_text()
    assert "## The production attribution checklist, for training" in design
    rows = [line for line in design.split("## The rules of instrumentation")[0].splitlines()
            if line.startswith("| ") and not line.startswith(("| ---", "| checklist item"))]
    assert len(rows) == 7
