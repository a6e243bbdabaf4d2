"""The training process's side of export: what leaves each rank and how.

``remote.py`` hands the emitter's records to the rank's exporter process (operations over a
socket, ``otel_train/wire``) and counts what is lost on the way: its ``RemotePipeline`` is
one of the two pipelines the emitter's ``Pipeline`` protocol names
(``otel_train/emitter/pipeline.py``, which this package does not import);
``prometheus.py`` serves the rank's own scrape endpoint. Spans, points and log records are built on the other side
(``otel_train/exporter``), which this package never imports.
"""
