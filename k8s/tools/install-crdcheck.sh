#!/usr/bin/env bash
# Build k8s/tools/crdcheck (strict decoding of rendered custom resources into the operators'
# Go API types) into k8s/tools/.bin/crdcheck, and download, through the Go module proxy, the
# modules whose CRD YAML files the tests validate against (listed in crdcheck/crds.json).
# Nothing fetched here is committed: it lives in Go's module cache.
#
# Idempotent and cached: the build is skipped when the stamp records the same hash of
# (go.mod, go.sum, main.go, go version). Prints the binary's path on its last line.
#
# Usage: k8s/tools/install-crdcheck.sh [--force]
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SRC="$HERE/crdcheck"
BIN_DIR="$HERE/.bin"
BINARY="$BIN_DIR/crdcheck"
STAMP="$BIN_DIR/.crdcheck.sha256"

log() { printf '[k8s/tools/install-crdcheck.sh] %s\n' "$*" >&2; }
command -v go >/dev/null || { log "go is not installed (need Go >= 1.26)"; exit 1; }

# The CRDs' modules (go mod download is a no-op when they are already in the module cache).
python3 - "$SRC/crds.json" <<'PY' | while read -r mod; do
import json, sys
for m in sorted({c["module"] + "@" + c["module_version"] for c in json.load(open(sys.argv[1]))["crds"]}):
    print(m)
PY
    (cd "$SRC" && go mod download "$mod")
    log "module in cache: $mod"
done

want="$( { cat "$SRC/go.mod" "$SRC/go.sum" "$SRC/main.go"; go env GOVERSION; } | sha256sum | cut -d' ' -f1)"
if [[ "${1:-}" != "--force" && -x "$BINARY" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
    log "crdcheck up to date"
    echo "$BINARY"
    exit 0
fi
mkdir -p "$BIN_DIR"
log "building crdcheck (k8s.io/api, client-go and the operators' API types: about five minutes on 2 busy cores)"
start=$SECONDS
(cd "$SRC" && go build -p 2 -trimpath -ldflags="-s -w" -o "$BINARY" .)
echo "$want" > "$STAMP"
log "built in $((SECONDS - start)) s"
echo "$BINARY"
