"""The metrics files reduced to their final cumulative values and the exemplars they carried.

Exports are cumulative snapshots, so the newest point of each series is its total; exemplars
are per collection interval, so every one seen is kept (a handful per export).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from otel_train import semconv as sc
from otel_train.analysis.otlp import Damage, MetricPoint, iter_metric_points, signal_files

#: (name, rank, labels, the series' start): a counter or histogram restarted by a new process
#: (a launcher's restart under the same run id) is a series of its own, and its totals add
SeriesKey = tuple[str, int | None, tuple[tuple[str, str], ...], int]


#: what a kept point holds of its exemplars and bucket counts: nothing, one list for all
#: (never written to)
_NONE_KEPT: list = []


@dataclass(frozen=True)
class Exemplar:
    metric: str
    rank: int | None
    trace_id: str
    span_id: str
    value: float


@dataclass
class MetricsDigest:
    last: dict[SeriesKey, MetricPoint] = field(default_factory=dict)
    exemplars: list[Exemplar] = field(default_factory=list)
    histogram_points: int = 0
    points_without_rank: dict[str, int] = field(default_factory=dict)
    _bounds: dict[tuple[float, ...], list[float]] = field(default_factory=dict, repr=False)
    _labels: dict[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]] = field(
        default_factory=dict, repr=False)
    #: name -> its series' points in ``last``'s order, made once read (:meth:`series`): the
    #: report asks for a dozen names, and a run of 16,384 ranks has ~600,000 series
    _by_name: dict[str, list[MetricPoint]] | None = field(default=None, repr=False,
                                                          compare=False)

    def add(self, point: MetricPoint) -> None:
        self._by_name = None
        point.name = sys.intern(point.name)  # one string for every rank's series of it
        labels = tuple(sorted((k, str(v)) for k, v in point.attributes.items()
                              if k not in (sc.ATTR_RANK, sc.ATTR_RUN_ID)))
        labels = self._labels.setdefault(labels, labels)  # one tuple for every rank's
        # cumulative points of one process share their start; a gauge's is no series' start
        key = (point.name, point.rank, labels, 0 if point.kind == "gauge" else point.start_ns)
        known = self.last.get(key)
        if known is None or point.time_ns >= known.time_ns:
            self.last[key] = point
        if point.name.startswith("training.") and sc.ATTR_RANK not in point.attributes:
            self.points_without_rank[point.name] = self.points_without_rank.get(point.name, 0) + 1
        if point.kind == "histogram":
            self.histogram_points += 1
            for raw in point.exemplars:
                value = raw.get("asDouble", raw.get("asInt", 0))
                self.exemplars.append(Exemplar(point.name, point.rank, raw.get("traceId", ""),
                                               raw.get("spanId", ""), float(value)))
        # what is kept of a point is its series' last value: its exemplars are taken above,
        # and its names are one string each however many ranks repeat them (a digest of
        # 16,384 ranks holds a few hundred thousand series)
        # nor are its bucket counts read by any reader of the digest (its count and sum are)
        point.exemplars = point.bucket_counts = _NONE_KEPT
        point.unit = sys.intern(point.unit)
        point.attributes = {sys.intern(k): sys.intern(v) if type(v) is str else v
                            for k, v in point.attributes.items()}
        if point.bounds:  # a histogram's bounds are its metric's, one list for all its series
            point.bounds = self._bounds.setdefault(tuple(point.bounds), point.bounds)

    def series(self, name: str) -> list[MetricPoint]:
        if self._by_name is None:
            self._by_name = {}
            for (n, _, _, _), point in self.last.items():
                self._by_name.setdefault(n, []).append(point)
        return list(self._by_name.get(name, ()))

    def per_rank_total(self, name: str) -> dict[int, float]:
        """Sum over label sets of the final value (or histogram sum) of ``name`` per rank."""
        totals: dict[int, float] = {}
        for point in self.series(name):
            rank = -1 if point.rank is None else point.rank
            totals[rank] = totals.get(rank, 0.0) + point.value
        return totals

    def per_rank_count(self, name: str) -> dict[int, int]:
        """Sum over label sets (and a restarted process's series) of the final count of the
        histogram ``name`` per rank: its steps, for the step histogram."""
        counts: dict[int, int] = {}
        for point in self.series(name):
            rank = -1 if point.rank is None else point.rank
            counts[rank] = counts.get(rank, 0) + point.count
        return counts

    def names(self) -> set[str]:
        return {name for name, _, _, _ in self.last}

    def window_s(self) -> float:
        """Seconds between the first start and the last point: the run's metric window."""
        starts = [p.start_ns for p in self.last.values() if p.start_ns]
        ends = [p.time_ns for p in self.last.values() if p.time_ns]
        return (max(ends) - min(starts)) / 1e9 if starts and ends else 0.0


def read_metrics(run_dir: Path, run_id: str | None = None,
                 damage: Damage | None = None) -> MetricsDigest:
    """The digest of ``run_dir``'s metrics files, run ``run_id``'s; damaged lines are
    counted in ``damage`` (else warned: :class:`~otel_train.analysis.otlp.Damage`)."""
    digest = MetricsDigest()
    for point in iter_metric_points(signal_files(run_dir, sc.METRICS_GLOB), run_id, damage):
        digest.add(point)
    return digest
