"""Histogram bucket boundaries shared by the OTel and Prometheus instruments.

These are the *fallback*: where the OTLP path exports exponential histograms
(``OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION=base2_exponential_bucket_histogram``,
as the k8s job examples set it), Prometheus stores each as one native histogram series and
these boundaries are unused. Where native histograms are not possible (a Prometheus without
them, the per-rank prometheus-client endpoint, the OTLP JSON files), every attribute set costs
len(SECONDS_BUCKETS) + 3 series (buckets, +Inf, _sum, _count): 10 boundaries keep a rank with
10 histogram attribute sets (step, 6 phases, 2 collective ops, compile) at 10 x 13 + 15 = 145
series, inside the 150 of docs/scaling.md (23 boundaries made it 273).

The boundaries live in ``otel_train/semconv.py`` beside the metric table that carries them
as each histogram's bucket advice; this module keeps their reasoning and their old name.
"""

from otel_train.semconv import SECONDS_BUCKETS

__all__ = ["SECONDS_BUCKETS"]
