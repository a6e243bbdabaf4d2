"""Every relative link in the user-facing markdown resolves to a file of the repository.

README.md, docs/*.md and bench/results/README.md link to each other and to the recorded
results; a renamed or removed results file must not leave a dead link behind. Links to a
``#anchor`` of a markdown file are checked against that file's headings too.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

#: [text](target) and [text](target "title"); images too. Not inside inline code.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"`[^`\n]*`")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)


def doc_files() -> list[Path]:
    files = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
             REPO / "bench" / "results" / "README.md"]
    return [f for f in files if f.exists()]


def anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    out: set[str] = set()
    for line in FENCE.sub("", markdown).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            text = re.sub(r"[^\w\- ]", "", m.group(1).replace("`", "")).strip().lower()
            out.add(text.replace(" ", "-"))
    return out


def links(markdown: str) -> list[str]:
    text = CODE_SPAN.sub("", FENCE.sub("", markdown))
    return LINK.findall(text)


def broken_links(path: Path) -> list[str]:
    broken = []
    for target in links(path.read_text(encoding="utf-8")):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("//"):
            continue  # http:, https:, mailto:...
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{target}: no such file")
            continue
        if anchor and dest.suffix == ".md" and dest.is_file():
            if anchor.lower() not in anchors(dest.read_text(encoding="utf-8")):
                broken.append(f"{target}: no heading #{anchor} in {dest.name}")
    return broken


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(path: Path) -> None:
    assert broken_links(path) == []


def test_the_checker_finds_a_broken_link(tmp_path: Path) -> None:
    (tmp_path / "there.md").write_text("# A heading\n")
    doc = tmp_path / "doc.md"
    doc.write_text("[ok](there.md) [ok](there.md#a-heading) [web](https://example.com)\n"
                   "`[in code](nowhere.md)`\n"
                   "[gone](bench/results/nowhere.md) [bad anchor](there.md#no-such)\n")
    assert broken_links(doc) == ["bench/results/nowhere.md: no such file",
                                 "there.md#no-such: no heading #no-such in there.md"]
