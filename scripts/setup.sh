#!/usr/bin/env bash
# Create .venv and install otel-train with its test tools, on a fresh machine.
# Idempotent: a second run only checks that everything is installed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
log() { printf '[setup] %s\n' "$*" >&2; }

PYTHON="${PYTHON:-python3}"
if [[ ! -x .venv/bin/python ]]; then
    log "creating .venv with $($PYTHON --version)"
    "$PYTHON" -m venv .venv
fi
log "installing otel-train[dev] (torch is a large download the first time; pip caches it)"
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[dev]'
# HolisticTraceAnalysis, to cross-check the profiler windows' overlap: installed without its
# declared notebook dependencies (jupyterlab, pytest pins); what it imports is in [dev].
.venv/bin/python -m pip install --quiet --no-deps 'holistictraceanalysis==0.5.0'
log "installed: $(.venv/bin/python -c 'import torch, opentelemetry.sdk.version as v; print("torch", torch.__version__, "opentelemetry-sdk", v.__version__)')"
