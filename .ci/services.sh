#!/usr/bin/env bash
# Start the services the test suite needs and write their URLs under .venv/.
# PostgreSQL 15 (Debian cluster 15/main): a `canaryd` role and a `canaryd_test` database.
set -euo pipefail
mkdir -p .venv
rm -f .venv/pg_url
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
