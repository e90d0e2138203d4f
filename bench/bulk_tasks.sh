#!/bin/sh
# 10,000 short tasks over 4 workers (--concurrency 16), all terminal exactly once.
# The same test the suite runs (10,000 tasks by default; MCPTASKS_TEST_BULK_TASKS changes it). PostgreSQL + Redis.
#   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test REDIS_URL=redis://127.0.0.1:6379/0 bench/bulk_tasks.sh
set -e
cd "$(dirname "$0")/.."
MCPTASKS_TEST_BULK_TASKS=${MCPTASKS_TEST_BULK_TASKS:-10000} exec .venv/bin/python -m pytest \
    tests/e2e/test_worker_multiprocess.py -k bulk -s -q -o timeout=1200 "$@"
