#!/usr/bin/env bash
# Build one Go tool pinned by the small module in DIR (its go.mod's `tool` line) from the Go
# module proxy into DIR/bin/NAME (git-ignored); the last line printed is the binary's path.
#
# Cached: skipped when the binary exists and the stamp records the same hash of (go.mod,
# go.sum, go version). Go's module and build caches stay in their default places, so a
# rebuild is incremental. Used by tools/jaeger/install.sh.
#
# Usage: tools/build-go-tool.sh DIR NAME PACKAGE VERSION-FLAG [--force]
set -euo pipefail

HERE="$(cd "$1" && pwd)"
NAME="$2"
PACKAGE="$3"
VERSION_FLAG="$4"
FORCE="${5:-}"
BINARY="$HERE/bin/$NAME"
STAMP="$HERE/bin/.stamp.sha256"

log() { printf '[tools/%s/install.sh] %s\n' "$NAME" "$*" >&2; }

command -v go >/dev/null || { log "go is not installed (need Go >= 1.26, as go.mod says)"; exit 1; }

want="$( { cat "$HERE/go.mod" "$HERE/go.sum"; go env GOVERSION; } | sha256sum | cut -d' ' -f1)"

if [[ "$FORCE" != "--force" && -x "$BINARY" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
    log "up to date (${want:0:12}), nothing to do"
    echo "$BINARY"
    exit 0
fi

mkdir -p "$HERE/bin"
rm -f "$STAMP"
log "building $BINARY ($PACKAGE, pinned in go.mod)"
start=$SECONDS
(cd "$HERE" && go build -mod=readonly -ldflags='-s -w' -o "$BINARY" "$PACKAGE")
log "built in $((SECONDS - start)) s"
"$BINARY" "$VERSION_FLAG" >&2 || true
echo "$want" > "$STAMP"
echo "$BINARY"
