#!/usr/bin/env bash
# Debian packages the tests use: prometheus + promtool, chromium (the report's HTML test).
# Idempotent: installs only what is missing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
log() { printf '[system-deps] %s\n' "$*" >&2; }

bash scripts/install-prometheus.sh
if ! command -v chromium >/dev/null 2>&1; then
    log "installing chromium"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null || apt-get update
    apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi
log "prometheus: $(prometheus --version 2>&1 | head -n1)"
log "chromium: $(chromium --version 2>/dev/null || echo missing)"
