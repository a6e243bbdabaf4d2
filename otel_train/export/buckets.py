"""Histogram bucket boundaries shared by the OTel and Prometheus instruments.

These are the *fallback*: where the OTLP path exports exponential histograms
(``OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION=base2_exponential_bucket_histogram``,
as the k8s job examples set it), Prometheus stores each as one native histogram series and
these boundaries are unused. Where native histograms are not possible (a Prometheus without
them, the per-rank prometheus-client endpoint, the OTLP JSON files), every attribute set costs
len(SECONDS_BUCKETS) + 3 series (buckets, +Inf, _sum, _count): 10 boundaries keep a rank with
10 histogram attribute sets (step, 6 phases, 2 collective ops, compile) at 10 x 13 + 15 = 145
series, inside the 150 of docs/scaling.md (23 boundaries made it 273).
"""

#: seconds, from a fast micro-step phase (5 ms) to a stalled collective (60 s: the
#: TrainingCollectiveStalled alert reads the le="60" bucket); above 60 s only +Inf
SECONDS_BUCKETS = (0.005, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0)
