#!/usr/bin/env bash
# Build Loki (the single binary `cmd/loki`, every component in one process) from the Go module
# proxy, as a Go tool of this small module (go.mod's `tool` line pins the version). Loki's own
# go.mod replaces a few dependencies with Grafana's forks (memberlist above all); replace
# directives only apply in the main module, so go.mod repeats them. The binary is
# tools/loki/bin/loki (git-ignored); the last line printed is its path. Cached
# (tools/build-go-tool.sh); the first build takes about 5 minutes on 2 cores.
#
# Usage: tools/loki/install.sh [--force]
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec bash "$HERE/../build-go-tool.sh" "$HERE" loki github.com/grafana/loki/v3/cmd/loki \
    -version "${1:-}"
