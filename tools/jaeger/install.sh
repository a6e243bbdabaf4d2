#!/usr/bin/env bash
# Build Jaeger v2 (the all-in-one `cmd/jaeger`, an OpenTelemetry Collector distribution with
# Jaeger's storage and query extensions) from the Go module proxy, as a Go tool of this small
# module (go.mod's `tool` line pins the version). The binary is tools/jaeger/bin/jaeger
# (git-ignored); the last line printed is its path.
#
# Cached: skipped when the binary exists and the stamp records the same hash of (go.mod,
# go.sum, go version). Go's module and build caches stay in their default places, so a
# rebuild is incremental. The first build compiles a large dependency tree: several minutes
# on 2 cores.
#
# Usage: tools/jaeger/install.sh [--force]
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BINARY="$HERE/bin/jaeger"
STAMP="$HERE/bin/.stamp.sha256"

log() { printf '[tools/jaeger/install.sh] %s\n' "$*" >&2; }

command -v go >/dev/null || { log "go is not installed (need Go >= 1.26, as go.mod says)"; exit 1; }

want="$( { cat "$HERE/go.mod" "$HERE/go.sum"; go env GOVERSION; } | sha256sum | cut -d' ' -f1)"

if [[ "${1:-}" != "--force" && -x "$BINARY" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
    log "up to date (${want:0:12}), nothing to do"
    echo "$BINARY"
    exit 0
fi

mkdir -p "$HERE/bin"
rm -f "$STAMP"
log "building $BINARY (github.com/jaegertracing/jaeger/cmd/jaeger, pinned in go.mod)"
start=$SECONDS
(cd "$HERE" && go build -mod=readonly -ldflags='-s -w' -o "$BINARY" \
    github.com/jaegertracing/jaeger/cmd/jaeger)
log "built in $((SECONDS - start)) s"
"$BINARY" version >&2 || true
echo "$want" > "$STAMP"
echo "$BINARY"
