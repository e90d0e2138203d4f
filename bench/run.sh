#!/usr/bin/env bash
# Issue 13 benchmark: tasks/get of mcptasks next to the official Python SDK and a bare Channels
# consumer, in one run (see bench/tasks_get.py). Needs PostgreSQL, Redis, wrk and taskset.
set -euo pipefail
cd "$(dirname "$0")/.."
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}"
export REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379/0}"
# wrk (Debian's package) drives the load.
command -v wrk >/dev/null 2>&1 || DEBIAN_FRONTEND=noninteractive apt-get install -y -q wrk >/dev/null \
    || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q wrk >/dev/null; }
# The other ASGI servers measured (daphne comes with the project).
.venv/bin/python -c "import granian, uvicorn" 2>/dev/null \
    || .venv/bin/python -m pip install -q "granian>=2,<3" "uvicorn[standard]>=0.36,<0.55"
.venv/bin/python bench/tasks_get.py "$@"
# (c) a status change in a worker to the notification at a client of another web process.
.venv/bin/python bench/notify_latency.py 10 20
