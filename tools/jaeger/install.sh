#!/usr/bin/env bash
# Build Jaeger v2 (the all-in-one `cmd/jaeger`, an OpenTelemetry Collector distribution with
# Jaeger's storage and query extensions) from the Go module proxy, as a Go tool of this small
# module (go.mod's `tool` line pins the version). The binary is tools/jaeger/bin/jaeger
# (git-ignored); the last line printed is its path. Cached (tools/build-go-tool.sh); the first
# build compiles a large dependency tree: several minutes on 2 cores.
#
# Usage: tools/jaeger/install.sh [--force]
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec bash "$HERE/../build-go-tool.sh" "$HERE" jaeger \
    github.com/jaegertracing/jaeger/cmd/jaeger version "${1:-}"
