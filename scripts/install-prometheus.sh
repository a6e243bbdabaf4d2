#!/usr/bin/env bash
# Install Prometheus and promtool (Debian's `prometheus` package) when either is missing.
# Idempotent: does nothing when both are on PATH.
#
# Debian's package starts a system `prometheus` service on :9090 from its postinst. Tests start
# their own Prometheus on free ports, so this script keeps the service from starting
# (policy-rc.d during the install) and stops and disables it if it is running anyway.
set -euo pipefail

log() { printf '[install-prometheus] %s\n' "$*" >&2; }

stop_system_service() {
    if command -v systemctl >/dev/null 2>&1 && systemctl is-system-running >/dev/null 2>&1; then
        systemctl disable --now prometheus >/dev/null 2>&1 || true
    fi
    if command -v service >/dev/null 2>&1; then
        service prometheus stop >/dev/null 2>&1 || true
    fi
    if [[ -x /usr/sbin/update-rc.d ]]; then
        update-rc.d prometheus disable >/dev/null 2>&1 || true
    fi
    # A daemon the init script started without systemd: stop it by its pid file, if any.
    local pidfile=/run/prometheus/prometheus.pid
    if [[ -f "$pidfile" ]]; then
        kill "$(cat "$pidfile")" 2>/dev/null || true
        rm -f "$pidfile"
    fi
}

if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
    log "already installed: $(prometheus --version 2>&1 | head -n1)"
    stop_system_service
    exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
    SUDO=sudo
else
    SUDO=
fi

log "installing Debian's prometheus package (without starting its service)"
policy=/usr/sbin/policy-rc.d
had_policy=0
if [[ -e "$policy" ]]; then had_policy=1; fi
if [[ $had_policy -eq 0 ]]; then
    # 101 = "action not allowed": invoke-rc.d then starts no service during the install.
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
    $SUDO chmod +x "$policy"
fi
cleanup() { if [[ $had_policy -eq 0 ]]; then $SUDO rm -f "$policy"; fi; }
trap cleanup EXIT

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null

stop_system_service
log "installed: $(prometheus --version 2>&1 | head -n1); promtool: $(command -v promtool)"
