"""The user-facing docs state what holds, not the project's diary.

README.md, docs/*.md and bench/results/README.md carry no commit hash (in prose or in a link
target: a result file is named by what it measures, and the commit it was measured on stays in
that file's own header) and no note on which machine was lent when. Things that look like a
hash but are not this project's commits are told apart by their context: hex inside a URL, a
colour code (``#9467bd``), a trace or span id in an example, an upstream repository's commit
cited as ``owner/repo commit <hash>``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

#: 7-12 lowercase hex characters, at least one digit and one letter, as a word ('-', '.' and
#: '/' end a word, so a hash inside a file name or a link target is found too).
HASH = re.compile(r"(?<![0-9A-Za-z_])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,12}"
                  r"(?![0-9A-Za-z_])")
URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+", re.I)
#: What may stand right before a hex word that is not this project's commit.
NOT_A_COMMIT_BEFORE = [
    re.compile(r"#$"),                                              # colour code, anchor
    re.compile(r"\b(?:trace|span|parent)[_ -]?id\W{0,4}$", re.I),  # ids in an example
    re.compile(r"\b[\w.-]+/[\w.-]+ commit $"),                      # upstream: owner/repo commit
]

#: Lease and machine-availability notes: which machine was (not) lent when is no fact a
#: user needs.
LEASE_PHRASES = [
    re.compile(r"\blent\b", re.I),
    re.compile(r"\b(?:device|a|the same|this) lease\b", re.I),
    re.compile(r"\bthis session\b", re.I),
    re.compile(r"\b(?:H100|H200|2-GPU|GPU|device's) kinds?\b", re.I),
    re.compile(r"\bkinds? (?:was |were )?refused\b", re.I),
    re.compile(r"\bthe call named\b", re.I),
    re.compile(r"\bdevice tool\b", re.I),
    re.compile(r"\bnvidia-h[12]00(?:-x\d)?\b", re.I),
    re.compile(r"\bstop \d+'s\b", re.I),
]


def doc_files() -> list[Path]:
    files = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
             REPO / "bench" / "results" / "README.md"]
    return [f for f in files if f.exists()]


def commit_hashes(text: str) -> list[str]:
    """Every hex word of ``text`` that stands for a commit, as 'line N: word'."""
    found = []
    for lineno, line in enumerate(text.splitlines(), 1):
        urls = [m.span() for m in URL.finditer(line)]
        for m in HASH.finditer(line):
            if any(a <= m.start() < b for a, b in urls):
                continue
            before = line[:m.start()]
            if any(p.search(before) for p in NOT_A_COMMIT_BEFORE):
                continue
            found.append(f"line {lineno}: {m.group()}")
    return found


def lease_notes(text: str) -> list[str]:
    found = []
    for lineno, line in enumerate(text.splitlines(), 1):
        for p in LEASE_PHRASES:
            for m in p.finditer(line):
                found.append(f"line {lineno}: {m.group()}")
    return found


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_commit_hash(path: Path) -> None:
    assert commit_hashes(path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_lease_or_availability_note(path: Path) -> None:
    assert lease_notes(path.read_text(encoding="utf-8")) == []


def test_the_checker_finds_hashes_and_leaves_what_is_not_a_commit() -> None:
    text = "\n".join([
        "Met on 36c08ca, one H100 ([results](bench/results/step-pairs-h100-1gpu-36c08ca-a.md)).",
        "An older run (f3d39ed's tree).",
        "Colour `#9467bd80`, trace_id=4bf92f3577, span id: 00f067aa0b,",
        "[a commit page](https://github.com/o/r/commit/36c08ca1) and NVIDIA/nccl commit 812d486f,",
        "numbers 1769699379 and 1000000, words like deadbeef or facade, hashes of 13: 36c08ca1234ab.",
    ])
    assert commit_hashes(text) == ["line 1: 36c08ca", "line 1: 36c08ca", "line 2: f3d39ed"]


def test_the_checker_finds_lease_notes() -> None:
    text = ("No H200 was lent on 2026-12-05 (the H200 kind gives an H100).\n"
            "The repeat on the same lease; the 2-GPU kinds are not lent; stop 44's reads.\n"
            "The release tag and a Kubernetes Lease object are fine.\n")
    assert lease_notes(text) == ["line 1: lent", "line 1: H200 kind", "line 2: lent",
                                 "line 2: the same lease", "line 2: 2-GPU kinds",
                                 "line 2: stop 44's"]
