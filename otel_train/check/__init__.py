"""The production attribution checklist, verified: ``otel-train check``.

``check_run_dir`` (:mod:`otel_train.check.rundir`) and ``check_prometheus``
(:mod:`otel_train.check.prometheus`) return one :class:`~otel_train.check.verdicts.CheckResult`
per item they can answer; :func:`~otel_train.check.verdicts.merge` folds several sources into
one row per item.
"""
