"""otel-train's version, in a module of its own: the exporter process reads it without
importing the package (whose ``__init__`` would import torch lazily, but still)."""

__version__ = "0.3.0"
