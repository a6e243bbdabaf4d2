"""The one thing pyproject.toml cannot say yet without setuptools' experimental table: the
step tracker's hot path in C (otel_train/_fastpath.c). It is optional: where it does not build
(no C compiler or Python headers, another platform) the install warns and goes on, and
tracker.py's Python core runs instead."""

import sys

from setuptools import Extension, setup

# dlopen/dlsym (the CUDA driver's event calls, sources/gpu/cuda_timing.py): libc holds them
# from glibc 2.34, libdl before
setup(ext_modules=[Extension("otel_train._fastpath", ["otel_train/_fastpath.c"],
                             libraries=["dl"] if sys.platform.startswith("linux") else [],
                             optional=True)])
