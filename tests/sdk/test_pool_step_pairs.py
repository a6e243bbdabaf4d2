"""bench/pool_step_pairs.py: several launches' step pairs pooled into one bound, refused where
the launches ran different product code (``otel_train/`` differs between their commits, in a
git repository made here)."""

from __future__ import annotations

import functools
import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@functools.cache
def _pool_module():  # noqa: ANN202
    """bench/pool_step_pairs.py, loaded once (it imports its sibling bench modules)."""
    import sys

    sys.path.insert(0, str(REPO / "bench"))
    spec = importlib.util.spec_from_file_location("pool_step_pairs",
                                                  REPO / "bench" / "pool_step_pairs.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _launch(path: Path, commit: str, inst_ms: float, background_s: float, n: int = 100
            ) -> Path:
    """A bench_step_pairs.py --json record: n pairs, bare 100 ms, instrumented inst_ms."""
    raw = {"bare_wall_ns": [100_000_000] * n, "inst_wall_ns": [int(inst_ms * 1e6)] * n,
           "bare_cpu_ns": [1_000_000] * n, "inst_cpu_ns": [1_000_100] * n,
           "first": ["bare", "inst"] * (n // 2), "elapsed_s": 25.0,
           "background_s": {"otel-train-emitter": background_s}, "steps_recorded": 2 * n,
           "block": 1, "bare_drain_ns": [0] * n, "inst_drain_ns": [0] * n}
    pairs = _pool_module().pairs
    record = {"environment": {"commit": commit, "date": "2026-12-05T00:00"},
              "summary": pairs.summarise(raw), "raw": raw}
    path.write_text(json.dumps(record), encoding="utf-8")
    return path


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, list[str]]:
    """Three commits: the product, a benchmark change, a product change."""
    git = ["git", "-C", str(tmp_path / "r"), "-c", "user.name=t", "-c", "user.email=t@t"]
    (tmp_path / "r" / "otel_train").mkdir(parents=True)
    (tmp_path / "r" / "bench").mkdir()
    subprocess.run(git[:3] + ["init", "-q"], check=True)
    commits = []
    for path, text in (("otel_train/a.py", "A = 1\n"), ("bench/b.py", "B = 1\n"),
                       ("otel_train/a.py", "A = 2\n")):
        (tmp_path / "r" / path).write_text(text)
        subprocess.run(git + ["add", "-A"], check=True)
        subprocess.run(git + ["commit", "-qm", path], check=True)
        commits.append(subprocess.run(git + ["rev-parse", "--short", "HEAD"], check=True,
                                      capture_output=True, text=True).stdout.strip())
    return tmp_path / "r", commits


def test_launches_of_one_product_pool_into_one_bound_with_its_verdict(tmp_path, repo) -> None:
    path, (c1, c2, _) = repo
    a = _launch(tmp_path / "a.json", c1, 100.2, 0.01)
    b = _launch(tmp_path / "b.json", c2, 100.6, 0.03)
    out, summary = tmp_path / "pooled.md", tmp_path / "pooled.json"
    rc = _pool_module().main(["--json", str(a), str(b), "--repo", str(path), "--out", str(out),
                              "--json-out", str(summary)])
    pooled = json.loads(summary.read_text())["pooled"]
    assert pooled["pairs"] == 200
    # the median of 100 pairs at 1.002 and 100 at 1.006; 0.04 s of threads over 200 pairs
    # is 200 us a 100 ms step: 0.002 more
    assert pooled["ratio"] == pytest.approx(1.004)
    assert pooled["background_us_per_step"] == pytest.approx(200.0)
    assert pooled["bound"] == pytest.approx(1.006)
    assert rc == 1, "1.006 misses the 1.005 bound: the run must say so by its exit status"
    text = out.read_text()
    assert "| **pooled** | | | 200 | **1.0040**" in text
    assert "1 of 2 at or under 1.005 alone" in text  # a: 1.002 + 0.001; b: 1.006 + 0.003
    assert "the same in every launch" in text


def test_launches_of_different_product_code_are_not_pooled(tmp_path, repo) -> None:
    path, (c1, _, c3) = repo
    a = _launch(tmp_path / "a.json", c1, 100.2, 0.01)
    b = _launch(tmp_path / "b.json", c3, 100.2, 0.01)
    with pytest.raises(SystemExit) as exit_:
        _pool_module().main(["--json", str(a), str(b), "--repo", str(path)])
    assert exit_.value.code == 2
    rc = _pool_module().main(["--json", str(a), str(b), "--repo", str(path),
                              "--allow-product-change", "--out", str(tmp_path / "p.md")])
    assert rc == 0  # 1.002 and 100 us a step: 1.003
    assert f"**differs** between {c1}..{c3}" in (tmp_path / "p.md").read_text()
