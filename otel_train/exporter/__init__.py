"""Where telemetry is built and exported: the exporter process (``process.py``, one per
rank, started by ``otel_train/export/remote.py``), or the emitter thread when export runs in
process. The records it receives and what each becomes are defined in ``otel_train/wire``;
this side builds them with the OpenTelemetry SDK (``providers.py``, whose ``Pipeline`` is
also the emitter's in-process pipeline: the other of the two the emitter's ``Pipeline``
protocol names, ``otel_train/emitter/pipeline.py``, which this package does not import) and
counts what it could not deliver. No torch here: the exporter process never imports it.
"""
