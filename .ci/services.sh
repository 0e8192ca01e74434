#!/usr/bin/env bash
# Start the services the test suite needs and write their URLs under .venv/.
# PostgreSQL 15 (Debian cluster 15/main): a `canaryd` role and a `canaryd_test` database.
set -euo pipefail
mkdir -p .venv
rm -f .venv/pg_url

# Debian packages a test needs, installed when missing (as root with apt-get; else the
# tests that need them skip, and say so). Nothing is started: without systemd a package's
# init script would start its own server (Prometheus on :9090, nginx on :80); a
# policy-rc.d that answers 101 ("action forbidden") stops that, as in Docker images.
can_apt() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; }
apt_install() {
    export DEBIAN_FRONTEND=noninteractive
    local own_policy=
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        own_policy=1
    fi
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "$@" >/dev/null
    [ -z "$own_policy" ] || rm -f /usr/sbin/policy-rc.d
}

# Prometheus: promtool checks the alert rules, and integration tests start their own
# `prometheus` on loopback.
if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
    if can_apt; then
        apt_install prometheus
        echo "services: installed prometheus ($(prometheus --version 2>&1 | head -n1))"
    else
        echo "services: promtool/prometheus not found and cannot apt-get install them" \
            "(not root); Prometheus integration tests will be skipped" >&2
    fi
fi
# Chromium: the report test opens canaryd's HTML report headless.
if ! command -v chromium >/dev/null 2>&1; then
    if can_apt; then
        apt_install chromium
        echo "services: installed $(chromium --version 2>/dev/null | head -n1)"
    else
        echo "services: chromium not found and cannot apt-get install it (not root);" \
            "the report browser test will be skipped" >&2
    fi
fi
# nginx: the router recipe test (docs/switch.md) and the live-traffic mirror test start
# their own on loopback with their own prefix.
if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
    if can_apt; then
        apt_install nginx
        echo "services: installed $(/usr/sbin/nginx -v 2>&1 | head -n1)"
    else
        echo "services: nginx not found and cannot apt-get install it (not root);" \
            "the nginx router and mirror tests will be skipped" >&2
    fi
fi
if ! command -v pg_ctlcluster >/dev/null 2>&1; then
    echo "services: pg_ctlcluster not found; PostgreSQL store tests will be skipped" >&2
    exit 0
fi
if ! pg_lsclusters -h 2>/dev/null | awk '{print $4}' | grep -q online; then
    pg_ctlcluster 15 main start
fi
for _ in $(seq 1 30); do
    su postgres -c "psql -qAtc 'select 1'" >/dev/null 2>&1 && break
    sleep 1
done
su postgres -c "psql -qAtc \"select 1 from pg_roles where rolname='canaryd'\"" | grep -q 1 \
    || su postgres -c "psql -qc \"create role canaryd login password 'canaryd'\""
su postgres -c "psql -qAtc \"select 1 from pg_database where datname='canaryd_test'\"" | grep -q 1 \
    || su postgres -c "psql -qc 'create database canaryd_test owner canaryd'"
echo "postgresql+psycopg://canaryd:canaryd@127.0.0.1:5432/canaryd_test" > .venv/pg_url
echo "services: PostgreSQL ready ($(cat .venv/pg_url))"
