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
trap 'rm -f "$PYTEST_LOG"' EXIT
.venv/bin/python -m pytest -q -p no:randomly --durations=15 "$@" 2>&1 | tee "$PYTEST_LOG"
step "MCP conformance suite"
bash .ci/conformance.sh

# Repeat pytest's counts last, so the closing line speaks for the whole test-suite.
count() { grep -Eo "[0-9]+ $1" "$PYTEST_LOG" | tail -1 | cut -d' ' -f1; }
printf '\npytest: %s passed, %s failed, %s skipped\n' "$(count passed || echo 0)" "$(count failed || echo 0)" \
    "$(count skipped || echo 0)"
