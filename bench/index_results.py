"""Write bench/results/README.md, the index of the recorded results, from the files' own headers.

    python bench/index_results.py            # (re)write bench/results/README.md
    python bench/index_results.py --check    # exit 1 and show a diff when it is stale, or
                                             # when a header is missing or a result is uncited
    python bench/index_results.py --uncited  # list the results nothing cites (exit 1 if any)

The index is generated, never edited: a figure's file states what holds, the index copies it.

Header convention
-----------------
A result file is a *record* (``.md``, ``.log``, ``.txt``: what a run printed or wrote up) or
*data* (``.json``, ``.jsonl``: a run's raw output). A record starts with a header of
``key: value`` lines (a record named in another record's ``data``, below, may go without):

- ``.md``: YAML front matter, the file's first line ``---``, then one ``key: value`` line per
  key (each value a YAML string on one line), then ``---``;
- ``.log``, ``.txt``: the file's first lines, each ``# key: value`` with one of the keys
  below; the first line that is not ends the header.

The keys, each required (``not recorded`` where the file itself does not say):

- ``what``: what was measured or run, in a line;
- ``machine``: where it ran (GPU and host, or this project's development VM);
- ``versions``: Python, torch, NCCL and so on, as the file records them;
- ``date``: the day (and time, where recorded) of the run;
- ``verdict``: against its target, met or missed and by what figure; a test run's counts;
  ``no target`` for a diagnostic.

Optional: ``made by`` (the script or command that wrote it) and ``data`` (the files of the
same run that this record describes, comma-separated, relative to the record; a folder stands
for every file in it). A file named in a record's ``data`` needs no header of its own and is
listed beside that record. Any other data file is a JSON object with a top-level ``"header"``
object of the same keys.

No commit hash, and no note on which machine was to be had when, goes into a header: the index
is a document, and tests/sdk/test_docs_state_what_holds.py checks it as one.

Citations
---------
A result file is kept while something cites it: its path (``bench/results/<file>``), its path
relative to bench/results/ or, for a file directly in bench/results/, its bare file name
appears in README.md, CHANGELOG.md, docs/, tests/, a script under bench/ (the benchmark that
writes it among them), otel_train/, scripts/ or .ci/, or in another result file that is kept
(a record names its data in ``data``; a record in a subfolder may name its neighbours by
bare name). A subfolder's path (``bench/results/<folder>/``) outside bench/results/ cites
every file in it (a doc pointing at a run's raw files); inside a result file it cites none.
The index itself cites nothing. A result nothing cites is removed (git keeps it).
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
INDEX = RESULTS / "README.md"

KEYS = ("what", "machine", "versions", "date", "verdict")
OPTIONAL_KEYS = ("made by", "data")

#: Where a citation counts (besides kept result files): files, or folders searched whole.
CITING_FILES = ("README.md", "CHANGELOG.md")
CITING_DIRS = ("docs", "tests", "bench", "otel_train", "scripts", ".ci")
CITING_SUFFIXES = ("", ".md", ".py", ".sh", ".c", ".h", ".txt", ".toml", ".yaml", ".yml",
                   ".cfg", ".ini", ".json")

#: A path-like word: what a citation can be.
PATH_WORD = re.compile(r"[\w.\-/]+")
ROOT_PREFIX = "bench/results/"


# ---------------------------------------------------------------------------------------------
# citations

def result_files(results: Path = RESULTS) -> list[Path]:
    """Every result file (the index excluded), sorted by path."""
    return sorted(p for p in results.rglob("*")
                  if p.is_file() and p != results / "README.md"
                  and "__pycache__" not in p.parts)


def rel(path: Path, results: Path = RESULTS) -> str:
    return path.relative_to(results).as_posix()


def citing_sources(repo: Path = REPO, results: Path = RESULTS) -> list[Path]:
    """The files outside bench/results/ whose mentions keep a result."""
    out = [repo / name for name in CITING_FILES if (repo / name).is_file()]
    for top in CITING_DIRS:
        base = repo / top
        if not base.is_dir():
            continue
        for p in sorted(base.rglob("*")):
            if (p.is_file() and p.suffix in CITING_SUFFIXES and results not in p.parents
                    and "__pycache__" not in p.parts):
                out.append(p)
    return out


def cited_in(text: str, here: str | None, files: set[str], dirs: set[str]) -> set[str]:
    """The result files (paths relative to bench/results/) that ``text`` cites.

    ``here`` is the citing file's folder relative to bench/results/ ("." for bench/results/
    itself) when it is a result file (relative names then resolve against it), else None.
    ``files`` and ``dirs`` are the result files and subfolders that exist, relative to
    bench/results/.
    """
    found: set[str] = set()
    for m in PATH_WORD.finditer(text):
        word = m.group().rstrip(".,:;")
        if not word:
            continue
        candidates = []
        if ROOT_PREFIX in word:
            candidates.append(word.rsplit(ROOT_PREFIX, 1)[1])
        elif here is not None:
            joined = Path(here, word).as_posix() if here != "." else word
            candidates.append(_normalise(joined))
            candidates.append(word)
        else:
            candidates.append(word)
        for cand in candidates:
            cand = cand.rstrip("/")
            if cand in ("", ".", ".."):
                continue
            if cand in files:
                # a bare name cites a file of a subfolder only from within that folder
                if "/" in cand and "/" not in word and ROOT_PREFIX not in word \
                        and here != cand.rsplit("/", 1)[0]:
                    continue
                found.add(cand)
            elif cand in dirs and "/" in word and here is None:
                found.update(f for f in files if f.startswith(cand + "/"))
    return found


def _normalise(path: str) -> str:
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                return ""
            parts.pop()
        else:
            parts.append(part)
    return "/".join(parts)


@dataclass
class Citations:
    """Who cites each result file: outside sources by path, result files by their name."""

    by: dict[str, list[str]] = field(default_factory=dict)

    @property
    def kept(self) -> set[str]:
        return {f for f, who in self.by.items() if who}

    def uncited(self) -> list[str]:
        return sorted(f for f, who in self.by.items() if not who)


def citations(repo: Path = REPO, results: Path = RESULTS) -> Citations:
    """Every result file and what cites it, following citations among kept result files."""
    paths = result_files(results)
    files = {rel(p, results) for p in paths}
    dirs = {rel(p, results) for p in results.rglob("*") if p.is_dir()}
    by: dict[str, list[str]] = {f: [] for f in files}
    for src in citing_sources(repo, results):
        text = src.read_text(encoding="utf-8", errors="replace")
        for f in cited_in(text, None, files, dirs):
            by[f].append(src.relative_to(repo).as_posix())
    texts = {rel(p, results): p.read_text(encoding="utf-8", errors="replace") for p in paths}
    todo = [f for f in files if by[f]]
    done: set[str] = set()
    while todo:
        f = todo.pop()
        if f in done:
            continue
        done.add(f)
        here = Path(f).parent.as_posix()
        for g in cited_in(texts[f], here, files, dirs):
            if g == f:
                continue
            if not by[g]:
                todo.append(g)
            by[g].append(f"bench/results/{f}")
    return Citations(by)


def mentioned_paths(text: str) -> list[str]:
    """Every ``bench/results/...`` path in ``text`` (a folder's with its trailing '/')."""
    out = []
    for m in re.finditer(r"bench/results/[\w.\-/]*", text):
        out.append(m.group().rstrip(".,:;"))
    return out


# ---------------------------------------------------------------------------------------------
# headers


class HeaderError(ValueError):
    pass


def read_header(path: Path) -> dict[str, str] | None:
    """The header of a record (or of a JSON object with a "header"), None where it has none."""
    if path.suffix == ".md":
        text = path.read_text(encoding="utf-8")
        if not text.startswith("---\n"):
            return None
        end = text.find("\n---\n", 3)
        if end < 0:
            raise HeaderError("front matter without its closing '---'")
        try:
            header = yaml.safe_load(text[4:end + 1])
        except yaml.YAMLError as exc:
            raise HeaderError(f"front matter is not YAML: {exc}") from exc
    elif path.suffix in (".log", ".txt"):
        header = {}
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            key, sep, value = line[2:].partition(": ")
            if not (line.startswith("# ") and sep and key in KEYS + OPTIONAL_KEYS):
                break
            header[key] = value.strip()
        if not header:
            return None
    elif path.suffix == ".json":
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            return None
        if not isinstance(doc, dict) or not isinstance(doc.get("header"), dict):
            return None
        header = doc["header"]
    else:
        return None
    if not isinstance(header, dict):
        raise HeaderError("the header is not key: value lines")
    for key, value in header.items():
        if key not in KEYS + OPTIONAL_KEYS:
            raise HeaderError(f"unknown header key {key!r}")
        if not isinstance(value, str) or not value.strip() or "\n" in value:
            raise HeaderError(f"header {key!r} is not a one-line text")
    missing = [k for k in KEYS if k not in header]
    if missing:
        raise HeaderError(f"header lacks {', '.join(missing)}")
    return header


def front_matter(header: dict[str, str]) -> str:
    """A header as YAML front matter (what this script parses back), for adding to a .md."""
    lines = ["---"]
    for key in KEYS + OPTIONAL_KEYS:
        if key in header:
            dumped = yaml.safe_dump({key: header[key]}, width=10_000, allow_unicode=True,
                                    sort_keys=False).rstrip("\n")
            lines.append(dumped)
    lines.append("---")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# the index

PREAMBLE = """\
# Recorded results

Each file here is the recorded output of a benchmark or test run, named by what it measures.
The docs cite them for their figures; what the figures mean and how they are measured is in
[docs/overhead.md](../../docs/overhead.md). Earlier runs of the same measurement are in git
history, not here: a result that no doc, test, script or other kept result cites is removed.

This index is generated by `python bench/index_results.py` from each file's own header (the
convention is in that script's docstring: what was measured, machine, versions, date and
verdict at the top of every record; a data file is listed beside the record that names it);
`tests/sdk/test_results_index.py` fails when it is stale, when a result is cited by nothing,
or when a doc names a result that is not here. "This VM" is the project's development
machine (2 vCPUs).
"""


@dataclass
class Row:
    path: str
    header: dict[str, str]
    data: list[str]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").strip()


def index_rows(results: Path = RESULTS) -> tuple[list[Row], list[str]]:
    """The index's rows, and the problems that keep it from being complete."""
    problems: list[str] = []
    rows: list[Row] = []
    files = {rel(p, results): p for p in result_files(results)}
    claimed: set[str] = set()
    for name, path in files.items():
        try:
            header = read_header(path)
        except HeaderError as exc:
            problems.append(f"{name}: {exc}")
            continue
        if header is None:
            continue
        data = []
        for item in filter(None, (s.strip() for s in header.get("data", "").split(","))):
            target = _normalise(Path(name).parent.joinpath(item).as_posix())
            inside = [f for f in files if f.startswith(target + "/")]
            if target in files:
                claimed.add(target)
            elif inside:
                claimed.update(inside)
                target += "/"
            else:
                problems.append(f"{name}: data {item!r} is no result file or folder")
                continue
            data.append(target)
        rows.append(Row(name, header, data))
    own = {r.path for r in rows}
    for name in files:
        if name not in claimed and name not in own:
            problems.append(f"{name}: no header (bench/index_results.py says how to write one), "
                            "and no record names it in its data")
    return rows, problems


def link(name: str, label: str | None = None) -> str:
    return f"[{label or name}]({name})"


def render(rows: Iterable[Row]) -> str:
    out = [PREAMBLE, "| file | what | machine | versions | date | verdict |",
           "| --- | --- | --- | --- | --- | --- |"]
    for row in sorted(rows, key=lambda r: r.path):
        cell = link(row.path)
        if row.data:
            cell += " (data: " + ", ".join(
                link(d, d if d.endswith("/") else Path(d).name) for d in row.data) + ")"
        h = row.header
        out.append("| " + " | ".join([cell, *(_cell(h[k]) for k in
                                             ("what", "machine", "versions", "date",
                                              "verdict"))]) + " |")
    return "\n".join(out) + "\n"


def generate(results: Path = RESULTS) -> tuple[str, list[str]]:
    rows, problems = index_rows(results)
    return render(rows), problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true",
                      help="compare with bench/results/README.md instead of writing it")
    mode.add_argument("--uncited", action="store_true",
                      help="list the result files nothing cites")
    args = parser.parse_args(argv)
    if args.uncited:
        uncited = citations().uncited()
        for f in uncited:
            print(f"bench/results/{f}")
        return 1 if uncited else 0
    text, problems = generate()
    problems += [f"{f}: cited by nothing (remove it, or cite it)"
                 for f in citations().uncited()]
    for p in problems:
        print(f"bench/results/{p}", file=sys.stderr)
    if args.check:
        current = INDEX.read_text(encoding="utf-8") if INDEX.exists() else ""
        if current != text:
            sys.stdout.writelines(difflib.unified_diff(
                current.splitlines(keepends=True), text.splitlines(keepends=True),
                "bench/results/README.md", "generated"))
            print("bench/results/README.md is stale: run python bench/index_results.py",
                  file=sys.stderr)
            return 1
        return 1 if problems else 0
    if problems:
        print("not written: fix the problems above", file=sys.stderr)
        return 2
    INDEX.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
