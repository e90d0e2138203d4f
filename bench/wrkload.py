"""A closed loop of MCP JSON-RPC POSTs driven by wrk (Debian's package), for the benches.

The benches share their machine's two cores with what they measure. Four aiohttp client processes
at 50 closed-loop clients took about 0.6 of a core (issue 27, twenty-third session), cores the
servers then could not use. wrk is a C client: about 40 us of CPU a request. :func:`run` opens one
session a client with the benches' own client (:func:`bench.loadclient.open_session`, so the
servers see the same sessions), then starts one wrk process per URL, one connection per session,
each request a new JSON-RPC id on the next of that URL's sessions. Every session keeps its own
headers, its bearer token included, so clients of several tenants share one wrk.

wrk reports each process's latency distribution, not every request's latency. Each process prints
``QUANTILES`` evenly spaced quantiles of its distribution. :func:`run` turns them back into one
value per request (``n`` requests become ``n`` values read off that process's quantiles), so the
processes' results add up to one list that ``statistics.median`` and ``_pct`` read like the other
clients' lists. A percentile read from the merged list is within one quantile step (0.1 %) of
the exact one.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from bench.loadclient import make_client, open_session

QUANTILES = 1000

# One session's headers a line ("Name: value" pairs split by tabs), taken in turn; a new id for
# every request. An answer without "result" counts as a failure. At the end: the requests, the
# failures and the quantiles (microseconds) of the latency distribution.
LUA = r"""
local sessions, n = {}, 0
failures = 0
function init(args)
  for line in string.gmatch(os.getenv("WRK_HEADERS") or "", "[^\n]+") do
    local h = {}
    for name, value in string.gmatch(line, "([^\t:]+): ([^\t]*)") do h[name] = value end
    table.insert(sessions, h)
  end
end
function request()
  n = n + 1
  return wrk.format("POST", nil, sessions[(n % #sessions) + 1], string.format(os.getenv("WRK_BODY"), n))
end
function response(status, hdrs, body)
  if status ~= 200 or not string.find(body, '"result"', 1, true) then failures = failures + 1 end
end
local threads = {}
function setup(thread) table.insert(threads, thread) end
function done(summary, latency, requests)
  local f = 0
  for _, t in ipairs(threads) do f = f + t:get("failures") end
  local q = tonumber(os.getenv("WRK_QUANTILES"))
  local parts = {}
  for i = 1, q do parts[i] = string.format("%d", latency:percentile((i - 0.5) * 100 / q)) end
  io.write(string.format("RESULT %d %d %s\n", summary.requests, f, table.concat(parts, " ")))
end
"""


def available() -> bool:
    """Whether wrk is installed."""
    return shutil.which("wrk") is not None


async def _sessions(urls: list[str], tokens: list[str], clients: int) -> dict[str, list[dict[str, str]]]:
    """``clients`` sessions (client i on ``urls[i % len]`` with ``tokens[i % len]``): their headers by URL."""
    client = make_client("aiohttp", 8)
    by_url: dict[str, list[dict[str, str]]] = {url: [] for url in urls}
    try:
        for i in range(clients):
            url = urls[i % len(urls)]
            by_url[url].append(await open_session(client, url, tokens[i % len(tokens)]))
    finally:
        await client.aclose()
    return {url: found for url, found in by_url.items() if found}


def _spread(count: int, quantiles: list[float]) -> list[float]:
    """``count`` values read off evenly spaced ``quantiles`` (sorted): the value at each request's rank."""
    if not quantiles or count <= 0:
        return []
    step = len(quantiles) / count
    return [quantiles[min(len(quantiles) - 1, int((i + 0.5) * step))] for i in range(count)]


def run(urls: list[str], tokens: list[str], clients: int, seconds: float, body: str
        ) -> tuple[int, list[float], int]:
    """``clients`` closed-loop wrk connections (one session each) for ``seconds``, posting
    ``body`` (a JSON-RPC text with one ``%d`` for the id): (requests answered, latencies in ms,
    one value a request as the module says, failures)."""
    if not available():
        raise RuntimeError("wrk is not installed (apt-get install wrk)")
    sessions = asyncio.run(_sessions(urls, tokens, clients))
    work = Path(tempfile.mkdtemp(prefix="bench-wrk-"))
    script = work / "mcp.lua"
    script.write_text(LUA)
    procs = []
    for url, found in sessions.items():
        headers = "\n".join("\t".join(f"{k}: {v}" for k, v in h.items()) for h in found)
        env = {**os.environ, "WRK_HEADERS": headers, "WRK_BODY": body, "WRK_QUANTILES": str(QUANTILES)}
        procs.append(subprocess.Popen(
            ["wrk", "-t1", f"-c{len(found)}", f"-d{max(1, round(seconds))}s", "--timeout", "10s", "-s", str(script),
             url], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    total, latencies, failures = 0, [], 0
    for proc in procs:
        out, _ = proc.communicate(timeout=seconds + 120)
        line = next((x for x in out.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            raise RuntimeError(f"wrk printed no result: {out[-500:]}")
        fields = line.split()
        n, failed = int(fields[1]), int(fields[2])
        answered = n - failed
        total += answered
        failures += failed
        latencies += _spread(answered, [int(x) / 1000 for x in fields[3:]])
    shutil.rmtree(work, ignore_errors=True)
    return total, latencies, failures
