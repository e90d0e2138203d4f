#!/bin/sh
# Issue 29: listen-notification latency next to its peer, the 2025-11-25 stream's, in one run.
# Alternates bench/listen_latency.py and bench/notify_latency.py ROUNDS times (TASKS tasks of 20
# status stamps each), printing the machine's load before each, so both see the same conditions.
#   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test REDIS_URL=redis://127.0.0.1:6379/0 \
#       bench/push_latency.sh [TASKS] [ROUNDS]
# To compare two revisions, run it from a checkout of each in turn (or alternate them by hand).
set -e
cd "$(dirname "$0")/.."
TASKS=${1:-20}
ROUNDS=${2:-2}
i=1
while [ "$i" -le "$ROUNDS" ]; do
    echo "round $i, listen (2026-07-28):   $(uptime)"
    .venv/bin/python bench/listen_latency.py "$TASKS" 20
    echo "round $i, notify (2025-11-25):   $(uptime)"
    .venv/bin/python bench/notify_latency.py "$TASKS" 20
    i=$((i + 1))
done
