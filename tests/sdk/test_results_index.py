"""bench/results/ states what holds: an index generated from the files' own headers, every
result cited by something, every result a doc names present.

bench/index_results.py writes bench/results/README.md from each result file's header (its
docstring defines the header and what counts as a citation); ``--check`` fails when the
index is stale. A result nothing cites is removed; a doc that names a result names one that
is there.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "index_results.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("index_results", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


ix = _load()


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def test_the_index_is_the_one_the_headers_make() -> None:
    run = subprocess.run([sys.executable, str(SCRIPT), "--check"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]


def test_every_result_file_is_cited() -> None:
    assert ix.citations().uncited() == []


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_result_a_doc_names_is_there(path: Path) -> None:
    missing = [p for p in ix.mentioned_paths(path.read_text(encoding="utf-8"))
               if not (REPO / p).exists()]
    assert missing == []


# --- the checker itself, on a tree of its own ---------------------------------------------


def _tree(tmp_path: Path) -> tuple[Path, Path]:
    repo = tmp_path / "repo"
    results = repo / "bench" / "results"
    (results / "raw").mkdir(parents=True)
    (repo / "docs").mkdir()
    header = ix.front_matter({"what": "a figure", "machine": "a VM", "versions": "Python 3",
                              "date": "2026-01-01", "verdict": "met: 1.0",
                              "data": "cited-run.json"})
    (results / "cited.md").write_text(header + "# A figure\n")
    (results / "cited-run.json").write_text("{}\n")
    (results / "linked.log").write_text(
        "# what: a test run\n# machine: a VM\n# versions: not recorded\n# date: not recorded\n"
        "# verdict: 1 passed\n# Recorded by hand: the first body line\n1 passed\n")
    (results / "raw" / "one.json").write_text("[]\n")
    (results / "raw" / "two.txt").write_text("ok\n")
    (results / "lonely.md").write_text("# Nobody names me\n")
    (results / "own.json").write_text(json.dumps({"header": {
        "what": "raw", "machine": "a VM", "versions": "not recorded", "date": "not recorded",
        "verdict": "no target"}, "x": 1}))
    (repo / "README.md").write_text("[a figure](bench/results/cited.md); "
                                    "raw files in `bench/results/raw/`.\n")
    (repo / "docs" / "x.md").write_text("See `own.json`; and bench/results/gone.md.\n")
    (results / "cited.md").write_text((results / "cited.md").read_text()
                                      + "The test log: linked.log.\n")
    return repo, results


def test_the_checker_finds_an_uncited_result(tmp_path: Path) -> None:
    repo, results = _tree(tmp_path)
    cites = ix.citations(repo, results)
    assert cites.uncited() == ["lonely.md"]
    assert cites.by["cited.md"] == ["README.md"]
    assert cites.by["linked.log"] == ["bench/results/cited.md"]  # a kept result cites it
    assert cites.by["cited-run.json"] == ["bench/results/cited.md"]  # named in its data
    assert cites.by["raw/one.json"] == ["README.md"]  # a folder named outside bench/results/
    assert cites.by["own.json"] == ["docs/x.md"]  # a bare name of bench/results/


def test_a_result_cited_only_by_an_uncited_one_is_uncited(tmp_path: Path) -> None:
    repo, results = _tree(tmp_path)
    (results / "lonely.md").write_text("# Nobody names me\nbut I name orphan.md\n")
    (results / "orphan.md").write_text("# Only lonely.md names me\n")
    assert ix.citations(repo, results).uncited() == ["lonely.md", "orphan.md"]


def test_the_checker_finds_a_missing_header_and_a_missing_file(tmp_path: Path) -> None:
    repo, results = _tree(tmp_path)
    rows, problems = ix.index_rows(results)
    assert sorted(r.path for r in rows) == ["cited.md", "linked.log", "own.json"]
    assert [r.data for r in rows if r.path == "cited.md"] == [["cited-run.json"]]
    assert [p.split(":")[0] for p in problems] == ["lonely.md", "raw/one.json", "raw/two.txt"]
    doc = (repo / "docs" / "x.md").read_text()
    assert [p for p in ix.mentioned_paths(doc) if not (repo / p).exists()] == [
        "bench/results/gone.md"]


def test_a_header_lacking_a_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.md"
    path.write_text("---\nwhat: a figure\nmachine: a VM\n---\n# x\n")
    with pytest.raises(ix.HeaderError, match="lacks versions, date, verdict"):
        ix.read_header(path)
    path.write_text("# x\n")
    assert ix.read_header(path) is None


def test_a_header_survives_its_front_matter() -> None:
    header = {"what": "a: colon, [brackets] and 'quotes'", "machine": "#1 host",
              "versions": "Python 3.12", "date": "2026-01-01", "verdict": "- missed: 1.2"}
    text = ix.front_matter(header)
    assert text.startswith("---\n") and text.endswith("\n---\n")
    assert yaml.safe_load(text.strip("-\n")) == header
