"""Offline attribution: ``otel-train report`` reads exported telemetry (a run directory or a
collector's file output, OTLP JSON lines) and says where the step time went.

``build_report(run_dir)`` in :mod:`otel_train.analysis.build` returns a
:class:`~otel_train.analysis.report_model.Report`; ``terminal``, ``html`` and ``Report.to_dict``
render it. Everything streams: see docs/report.md.
"""
