"""Run the official MCP conformance suite against real servers started by :mod:`tests.support.servers`.

``.ci/conformance.sh`` installs the suites and Node 22, then runs
``python -m tests.support.conformance NODE SUITE NODE_2026 SUITE_2026``: for each revision,
once on the embedded default (SQLite,
in-memory layer, worker inside daphne) and, when ``DATABASE_URL`` is PostgreSQL, once on a
scratch database; with ``REDIS_URL`` set too, that run is the production layout: uvicorn and a
separate worker. The servers are
started exactly as the end-to-end tests start them, on the default settings. The expected-
failures baseline is ``server: []``, so any failure *or warning* fails the run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.servers import FAST_SETTINGS, PRODUCTION_SERVER, make_stack

#: What the stack adds for the e2e tests that the conformance runs must not have.
_TEST_ONLY = ("MCPTASKS_EXTRA_APPS", *FAST_SETTINGS)


@contextmanager
def _environ(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


#: How each suite is asked to run: 0.1.16 with every scenario (2025-11-25), 0.2.0 with the
#: scenarios the 2026-07-28 revision requires (plus the not-scored tasks extension ones).
SUITE_ARGS: dict[str, list[str]] = {
    "2025-11-25": ["--suite", "all"],
    "2026-07-28": ["--requirements", "2026-07-28"],
}


def run_suite(
    label: str, *, node: str, suite: str, database_url: str, redis_url: str, revision: str = "2025-11-25",
    scenario: str | None = None,
) -> bool:
    """One run of the suite for ``revision``; prints the suite's report, and log tails on failure."""
    work = Path(tempfile.mkdtemp(prefix=f"mcptasks-conformance-{label}-"))
    with _environ(DATABASE_URL=database_url, REDIS_URL=redis_url):
        stack, teardown = make_stack(work)
    for key in _TEST_ONLY:
        stack.env.pop(key, None)
    try:
        # SQLite: daphne with its embedded worker (the newcomer's default); PostgreSQL + Redis:
        # uvicorn and a separate worker (the production layout, docs/operations.md).
        web = stack.web(server=PRODUCTION_SERVER if stack.multi_process else "daphne")
        if stack.multi_process:
            stack.worker(concurrency=8)
        label = f"{revision}, {label}"
        print(f"\n=== conformance ({label}) on {web.url} ===", flush=True)
        baseline = work / "baseline.yml"
        baseline.write_text("server: []\n")
        args = ["--scenario", scenario] if scenario else SUITE_ARGS[revision]
        run = subprocess.run(
            [node, suite, "server", "--url", web.url, *args, "--expected-failures", str(baseline)],
            cwd=work, capture_output=True, text=True, timeout=900,
        )
        print(run.stdout, run.stderr, sep="\n", flush=True)
        if run.returncode == 0 and re.search(r"^Total: \d+ passed, 0 failed", run.stdout, re.M):
            total = re.search(r"^Total: .*$", run.stdout, re.M)
            print(f"conformance ({label}): {total.group(0) if total else ''}, no warnings", flush=True)
            return True
        print(f"conformance ({label}): FAILED (exit {run.returncode}; any failure or warning fails)")
        for proc in stack.procs:
            print(f"--- {proc.log.name} (tail) ---\n" + "\n".join(proc.log_text().splitlines()[-60:]))
        return False
    finally:
        teardown()


def main(argv: list[str]) -> int:
    """``python -m tests.support.conformance NODE SUITE [NODE_2026 SUITE_2026]``: every run; 0 when all pass.

    The first suite measures 2025-11-25; the optional second one (0.2.0) the 2026-07-28
    requirement set. The first runs on SQLite and, when ``DATABASE_URL`` is PostgreSQL, there
    too; the second on PostgreSQL (granian and a separate worker) when it can, else on SQLite.
    """
    runs = [("2025-11-25", argv[0], argv[1])]
    if len(argv) >= 4:
        runs.append(("2026-07-28", argv[2], argv[3]))
    ok = True
    database_url = os.environ.get("DATABASE_URL", "")
    postgres = database_url.startswith(("postgres://", "postgresql://"))
    for revision, node, suite in runs:
        # 2025-11-25 runs on both setups; 2026-07-28 (its own protocol adapter over the same
        # engine) on the production one when there is one, else the embedded default: CI time.
        if revision == "2025-11-25" or not postgres:
            ok = run_suite("sqlite", node=node, suite=suite, database_url="", redis_url="", revision=revision) and ok
        if postgres:
            ok = run_suite("postgres", node=node, suite=suite, database_url=database_url,
                           redis_url=os.environ.get("REDIS_URL", ""), revision=revision) and ok
        else:
            print(f"conformance ({revision}): DATABASE_URL is not PostgreSQL; skipped the PostgreSQL run")
    if ok:
        print("conformance: all runs passed with 0 failures and 0 warnings")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
