#!/usr/bin/env bash
# Build Loki (the single binary `cmd/loki`, every component in one process) from the Go module
# proxy, as a Go tool of this small module (go.mod's `tool` line pins the version). Loki's own
# go.mod replaces a few dependencies with Grafana's forks (memberlist above all); replace
# directives only apply in the main module, so go.mod repeats them. The binary is
# tools/loki/bin/loki (git-ignored); the last line printed is its path.
#
# Cached: skipped when the binary exists and the stamp records the same hash of (go.mod,
# go.sum, go version). The first build compiles a large dependency tree: about 5 minutes on
# 2 cores.
#
# Usage: tools/loki/install.sh [--force]
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BINARY="$HERE/bin/loki"
STAMP="$HERE/bin/.stamp.sha256"

log() { printf '[tools/loki/install.sh] %s\n' "$*" >&2; }

command -v go >/dev/null || { log "go is not installed (need Go >= 1.26, as go.mod says)"; exit 1; }

want="$( { cat "$HERE/go.mod" "$HERE/go.sum"; go env GOVERSION; } | sha256sum | cut -d' ' -f1)"

if [[ "${1:-}" != "--force" && -x "$BINARY" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
    log "up to date (${want:0:12}), nothing to do"
    echo "$BINARY"
    exit 0
fi

mkdir -p "$HERE/bin"
rm -f "$STAMP"
log "building $BINARY (github.com/grafana/loki/v3/cmd/loki, pinned in go.mod)"
start=$SECONDS
(cd "$HERE" && go build -mod=readonly -ldflags='-s -w' -o "$BINARY" \
    github.com/grafana/loki/v3/cmd/loki)
log "built in $((SECONDS - start)) s"
"$BINARY" -version >&2 || true
echo "$want" > "$STAMP"
echo "$BINARY"
