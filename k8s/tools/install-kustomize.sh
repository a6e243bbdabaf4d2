#!/usr/bin/env bash
# Install kustomize into k8s/tools/.bin/ (git-ignored) from the Go module proxy, built with
# the machine's Go. Idempotent and cached: nothing is done when the binary there already
# reports the pinned version. Prints the binary's path on its last line.
#
# Version: sigs.k8s.io/kustomize/kustomize/v5 v5.8.2 (go.mod says go 1.26.0; v5.8.3 needs 1.27).
#
# Usage: k8s/tools/install-kustomize.sh [--force]
set -euo pipefail

KUSTOMIZE_VERSION="v5.8.2"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BIN_DIR="$HERE/.bin"
BINARY="$BIN_DIR/kustomize"

log() { printf '[k8s/tools/install-kustomize.sh] %s\n' "$*" >&2; }
command -v go >/dev/null || { log "go is not installed (need Go >= 1.26)"; exit 1; }

if [[ "${1:-}" != "--force" && -x "$BINARY" ]] \
    && "$BINARY" version 2>/dev/null | grep -q "${KUSTOMIZE_VERSION}"; then
    log "kustomize $KUSTOMIZE_VERSION already installed"
    echo "$BINARY"
    exit 0
fi

mkdir -p "$BIN_DIR"
log "installing sigs.k8s.io/kustomize/kustomize/v5@$KUSTOMIZE_VERSION (a few minutes on 2 cores the first time)"
start=$SECONDS
# -ldflags: kustomize reads its version from the module's build info; keep the binary small.
GOBIN="$BIN_DIR" GOFLAGS="${GOFLAGS:-} -p=2" \
    go install -ldflags="-s -w" "sigs.k8s.io/kustomize/kustomize/v5@$KUSTOMIZE_VERSION"
log "installed in $((SECONDS - start)) s: $("$BINARY" version)"
echo "$BINARY"
