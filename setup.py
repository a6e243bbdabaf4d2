"""The one thing pyproject.toml cannot say yet without setuptools' experimental table: the
step tracker's hot path in C (otel_train/_fastpath.c). It is optional: where it does not build
(no C compiler or Python headers, another platform) the install warns and goes on, and
tracker.py's Python core runs instead."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("otel_train._fastpath", ["otel_train/_fastpath.c"],
                             optional=True)])
