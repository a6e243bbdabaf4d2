#!/usr/bin/env bash
# Install everything the tests need, from nothing, then run them all.
#
#   bash scripts/test.sh [pytest args...]
#
# Installs: the Python package and test tools (.venv), the OpenTelemetry Collector built from
# collector/manifest.yaml with Go, Jaeger (a Go tool), kustomize and the CRD checker,
# the dashboards' query checkers, Debian's prometheus/promtool and chromium. Each test starts
# the servers it uses (collector, Prometheus, chromium) on free loopback ports and stops them.
# With CI=true, a test that needs a missing binary fails instead of skipping.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
log() { printf '[test] %s\n' "$*" >&2; }
start=$(date +%s)

bash scripts/setup.sh
bash scripts/install-system-deps.sh
log "building the collector (cached after the first build)"
OTEL_TRAIN_COLLECTOR_BIN="$(bash collector/build.sh | tail -n1)"
export OTEL_TRAIN_COLLECTOR_BIN
log "building Jaeger, the live trace backend of otel-train check (cached)"
OTEL_TRAIN_JAEGER_BIN="$(bash tools/jaeger/install.sh | tail -n1)"
export OTEL_TRAIN_JAEGER_BIN
log "installing kustomize and the custom-resource checker (cached)"
OTEL_TRAIN_KUSTOMIZE_BIN="$(bash k8s/tools/install-kustomize.sh | tail -n1)"
OTEL_TRAIN_CRDCHECK_BIN="$(bash k8s/tools/install-crdcheck.sh | tail -n1)"
export OTEL_TRAIN_KUSTOMIZE_BIN OTEL_TRAIN_CRDCHECK_BIN
log "building the query checkers (Prometheus's PromQL parser in Go; Grafana's TraceQL/LogQL grammars)"
(cd dashboards/tools/promqlcheck && go build -o promqlcheck .)
(cd dashboards/tools/querycheck && { [[ -d node_modules ]] || npm ci --no-audit --no-fund --silent; })

if [[ "${CI:-}" == "true" || "${CI:-}" == "1" ]]; then
    export OTEL_TRAIN_REQUIRE_BINARIES=1
fi
log "setup took $(( $(date +%s) - start ))s; running the tests"
.venv/bin/python -m pytest -ra "$@"
