"""Histogram bucket boundaries shared by the OTel and Prometheus instruments."""

#: seconds, from a fast micro-step phase (1 ms) to a slow step with a compile (10 min)
SECONDS_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.35, 0.5, 0.75,
    1.0, 1.5, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)
