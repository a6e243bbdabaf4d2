#!/usr/bin/env bash
# Build otel-train's collector distribution (binary: collector/_build/otelcol-train) with the
# OpenTelemetry Collector Builder, from collector/manifest.yaml.
#
# Cached: the build is skipped when the binary exists and the stamp file records the same
# hash of (manifest, builder version, go version). Go's module and build caches stay in
# their default places, so a rebuild after a manifest change is incremental too.
#
# Usage: collector/build.sh [--force]
set -euo pipefail

BUILDER_VERSION="v0.161.0"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MANIFEST="$HERE/manifest.yaml"
OUT_DIR="$HERE/_build"
BINARY="$OUT_DIR/otelcol-train"
STAMP="$OUT_DIR/.manifest.sha256"

log() { printf '[collector/build.sh] %s\n' "$*" >&2; }

command -v go >/dev/null || { log "go is not installed (need Go >= 1.26)"; exit 1; }

want="$( { cat "$MANIFEST"; echo "builder=$BUILDER_VERSION"; go env GOVERSION; } | sha256sum | cut -d' ' -f1)"

if [[ "${1:-}" != "--force" && -x "$BINARY" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
    log "up to date (manifest hash ${want:0:12}), nothing to do"
    echo "$BINARY"
    exit 0
fi

GOBIN_DIR="$(go env GOPATH)/bin"
BUILDER="$GOBIN_DIR/builder"
if ! [[ -x "$BUILDER" ]] || ! "$BUILDER" version 2>&1 | grep -q "${BUILDER_VERSION#v}"; then
    log "installing go.opentelemetry.io/collector/cmd/builder@$BUILDER_VERSION"
    go install "go.opentelemetry.io/collector/cmd/builder@$BUILDER_VERSION"
fi
log "builder: $("$BUILDER" version 2>&1 | head -n1)"

mkdir -p "$OUT_DIR"
rm -f "$STAMP"
log "building $BINARY from $MANIFEST (the first build downloads and compiles a large dependency tree: 15+ minutes on 2 cores)"
start=$SECONDS
# The builder resolves output_path relative to the working directory.
(cd "$HERE" && "$BUILDER" --config="$MANIFEST" --verbose)
log "built in $((SECONDS - start)) s"

"$BINARY" --version >&2
echo "$want" > "$STAMP"
log "binary: $BINARY"
echo "$BINARY"
