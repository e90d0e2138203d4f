#!/usr/bin/env bash
# The README's test command: set up a virtualenv, then lint, type-check, check Django, check
# migrations, run pytest and the official MCP conformance suite.
# Without DATABASE_URL/REDIS_URL the tests use SQLite and the in-memory channel layer
# (PostgreSQL/Redis-only tests skip, printing why).
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e ".[dev]"

step() { printf '\n== %s ==\n' "$*"; }

step "ruff"
.venv/bin/ruff check .
step "mypy"
.venv/bin/mypy mcptasks tenants
step "manage.py check"
DEBUG=1 .venv/bin/python manage.py check --fail-level WARNING
step "makemigrations --check"
.venv/bin/python manage.py makemigrations --check --dry-run
step "pytest (database: ${DATABASE_URL:-sqlite}, channel layer: ${REDIS_URL:-in-memory})"
PYTEST_LOG="$(mktemp)"
# The fast subset first (no process started, under a minute: a broken commit fails early), then
# everything else; `-m` splits the suite so no test runs twice. Arguments go to both runs.
FAST_LOG="$(mktemp)"
trap 'rm -f "$PYTEST_LOG" "$FAST_LOG"' EXIT
# Exit status 5 ("no tests ran") is fine: the arguments may select tests of one run only.
run_pytest() {
    local log="$1"; shift
    set +e
    .venv/bin/python -m pytest -q -p no:randomly "$@" 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    set -e
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then exit "$rc"; fi
}
step "pytest, fast subset (-m fast: starts no process; under a minute on SQLite, about two on PostgreSQL)"
run_pytest "$FAST_LOG" -m fast "$@"
# The rest mostly waits on the processes it starts (servers, workers, PgBouncer, Sentinel, a
# browser), so it runs on TEST_WORKERS pytest-xdist workers (2 by default: 28 minutes serially on
# a slow 2-core machine, 12 on two). A module stays on one worker (--dist loadfile): its
# module-scoped servers are started once. Each worker's session has its own stack (database,
# channel-layer prefix, ports) and pytest-django gives each its own test database.
# `-n 0` among the arguments runs it serially.
step "pytest, the rest (-m 'not fast': processes, slow, e2e; ${TEST_WORKERS:-2} workers)"
run_pytest "$PYTEST_LOG" --durations=15 -n "${TEST_WORKERS:-2}" --dist loadfile -m "not fast" "$@"
step "MCP conformance suite"
bash .ci/conformance.sh

# Repeat pytest's counts last, both runs added up, so the closing line speaks for the whole
# test-suite (each test ran in exactly one of the two).
count() { grep -Eo "[0-9]+ $1" "$2" | tail -1 | cut -d' ' -f1; }
total() { echo $(( $(count "$1" "$FAST_LOG" || echo 0) + $(count "$1" "$PYTEST_LOG" || echo 0) )); }
printf '\npytest: %s passed, %s failed, %s skipped\n' "$(total passed)" "$(total failed)" "$(total skipped)"
