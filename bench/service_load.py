"""Load test of the hetplan service on loopback: stored-plan reads and evaluations.

Starts `hetplan serve` on 127.0.0.1 (SQLite file or a fresh PostgreSQL schema), measures
the time from process start to the first answer of /healthz, stores one plan, then runs
closed-loop clients (each sends its next request when the last one is answered) over
keep-alive HTTP/1.1 connections, bounded by a duration and a request count per run.

    .venv/bin/python bench/service_load.py --db sqlite --db postgresql \
        --clients 16 --clients 64 --duration-s 10 --markdown bench/RESULTS-service.md

The load generator is a small asyncio HTTP/1.1 client (not httpx) so that it takes as
little as possible of the CPUs it shares with the server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "api" / "data"
PG_URL = os.environ.get("HETPLAN_BENCH_PG_URL",
                        "postgresql+psycopg://postgres@127.0.0.1:5432/test")


@dataclass(frozen=True, kw_only=True)
class RunResult:
    db: str
    workers: int
    cache: bool
    operation: str
    clients: int
    requests: int
    errors: int
    seconds: float
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    load1: float
    """1-minute load average just before the run: other work on the machine shows here."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """A `hetplan serve` child process (of this checkout) on a loopback port."""

    def __init__(self, *, database_url: str, workers: int, cache: bool) -> None:
        self.port = free_port()
        env = {**os.environ, "HETPLAN_DATABASE_URL": database_url,
               "HETPLAN_PLAN_CACHE_BYTES": str(64 * 2**20) if cache else "0"}
        env.pop("HETPLAN_TOKENS", None)
        # this checkout's code, not whatever checkout the installed `hetplan` script is of
        hetplan = [sys.executable, "-c", "from api.cli import main; main()"]
        self.started = time.perf_counter()
        self.process = subprocess.Popen(
            [*hetplan, "serve", "--host", "127.0.0.1", "--port", str(self.port),
             "--workers", str(workers), "--log-level", "warning"],
            env=env, cwd=ROOT, start_new_session=True)
        self.first_answer_s = self._wait_ready()

    def _wait_ready(self, timeout_s: float = 60) -> float:
        url = f"http://127.0.0.1:{self.port}/healthz"
        while time.perf_counter() - self.started < timeout_s:
            if self.process.poll() is not None:
                raise RuntimeError(f"hetplan serve exited with {self.process.returncode}")
            try:
                with urllib.request.urlopen(url, timeout=1) as response:
                    if response.status == 200:
                        return time.perf_counter() - self.started
            except OSError:
                time.sleep(0.005)
        raise RuntimeError(f"hetplan serve did not answer within {timeout_s} s")

    def request(self, method: str, path: str, body: Any | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data,
                                         method=method,
                                         headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.loads(response.read())

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


async def _client(port: int, request: bytes, deadline: float, budget: list[int],
                  latencies: list[float], errors: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while time.perf_counter() < deadline and budget[0] > 0:
            budget[0] -= 1
            sent = time.perf_counter()
            writer.write(request)
            status_line = await reader.readline()
            length = 0
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b""):
                    break
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            await reader.readexactly(length)
            latencies.append(time.perf_counter() - sent)
            if not status_line.startswith(b"HTTP/1.1 200"):
                errors[0] += 1
    finally:
        writer.close()


def http_request(method: str, path: str, body: bytes = b"") -> bytes:
    head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


async def _load(port: int, request: bytes, clients: int, duration_s: float,
                max_requests: int) -> tuple[list[float], int, float]:
    latencies: list[float] = []
    errors = [0]
    budget = [max_requests]
    started = time.perf_counter()
    deadline = started + duration_s
    await asyncio.gather(*(_client(port, request, deadline, budget, latencies, errors)
                           for _ in range(clients)))
    return latencies, errors[0], time.perf_counter() - started


def run_load(port: int, request: bytes, *, clients: int, duration_s: float,
             max_requests: int, warmup_s: float = 1.0) -> tuple[list[float], int, float]:
    asyncio.run(_load(port, request, clients, warmup_s, max_requests))  # warm caches, pools
    return asyncio.run(_load(port, request, clients, duration_s, max_requests))


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000)[int(q * 1000) - 1] if len(values) > 1 else 0.0


def fresh_database(kind: str, folder: Path) -> tuple[str, Any]:
    """A database URL for one run, and a function that removes the database."""
    if kind == "sqlite":
        path = folder / f"bench-{uuid.uuid4().hex[:8]}.db"
        return f"sqlite:///{path}", lambda: [p.unlink(missing_ok=True) for p in
                                               folder.glob(path.name + "*")]
    import sqlalchemy as sa

    schema = f"bench_{uuid.uuid4().hex[:8]}"
    engine = sa.create_engine(PG_URL)
    with engine.begin() as connection:
        connection.execute(sa.text(f'CREATE SCHEMA "{schema}"'))

    def drop() -> None:
        with engine.begin() as connection:
            connection.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        engine.dispose()

    return f"{PG_URL}?options=-csearch_path%3D{schema}", drop


def bench_database(kind: str, args: argparse.Namespace, folder: Path,
                   workers: int, cache: bool) -> list[RunResult]:
    url, drop = fresh_database(kind, folder)
    server = Server(database_url=url, workers=workers, cache=cache)
    results = []
    try:
        scenario = json.loads((DATA / "scenario.json").read_text())
        plan = json.loads((DATA / "plan.json").read_text())
        stored = server.request("POST", "/v1/plans",
                                {"scenario": scenario, "options": {"time_limit_s": 2}})
        operations = {
            "GET /v1/plans/{id}": http_request("GET", f"/v1/plans/{stored['id']}"),
            "POST /v1/evaluate": http_request(
                "POST", "/v1/evaluate", json.dumps({"scenario": scenario, "plan": plan}).encode()),
        }
        for operation, request in operations.items():
            if args.operation and operation.split()[0].lower() not in args.operation:
                continue
            if operation.startswith("POST") and not cache:
                continue  # evaluation does not touch the plan cache: measured once
            for clients in args.clients:
                load1 = os.getloadavg()[0]
                latencies, errors, seconds = run_load(
                    server.port, request, clients=clients, duration_s=args.duration_s,
                    max_requests=args.max_requests)
                result = RunResult(
                    db=kind, workers=workers, cache=cache, operation=operation,
                    clients=clients, requests=len(latencies), errors=errors,
                    seconds=round(seconds, 2),
                    requests_per_s=round(len(latencies) / seconds, 1),
                    p50_ms=round(percentile(latencies, 0.5) * 1000, 2),
                    p99_ms=round(percentile(latencies, 0.99) * 1000, 2), load1=round(load1, 2))
                print(json.dumps(asdict(result)), flush=True)
                results.append(result)
    finally:
        server.stop()
        drop()
    return results


def first_answer_times(kind: str, workers: int, runs: int, folder: Path) -> list[float]:
    """Seconds from starting `hetplan serve` to its first /healthz answer, `runs` times,
    each on a new empty database (so the schema migration is included)."""
    times = []
    for _ in range(runs):
        url, drop = fresh_database(kind, folder)
        server = Server(database_url=url, workers=workers, cache=True)
        times.append(server.first_answer_s)
        server.stop()
        drop()
    return times


def markdown(results: list[RunResult], first_answers: dict[str, list[float]],
             command: str) -> str:
    lines = [
        "# Service benchmark (bench/service_load.py)",
        "",
        f"- date: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- machine: {platform.node()}, {os.cpu_count()} CPUs "
        f"({platform.processor() or platform.machine()}), Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}",
        "- load generator and server on the same machine, over 127.0.0.1, keep-alive "
        "HTTP/1.1, closed loop (each client waits for its answer before the next request)",
        f"- command: `{command}`",
        "",
        "## Time to first answer after `hetplan serve` starts",
        "",
        "Each start on a new empty database (Alembic creates the schema before serving).",
        "",
        "| database, server processes | starts | median (s) | min (s) | max (s) |",
        "| --- | --- | --- | --- | --- |",
        *[f"| {k} | {len(v)} | {statistics.median(v):.2f} | {min(v):.2f} | {max(v):.2f} |"
          for k, v in first_answers.items()],
        "",
        "## Throughput and latency",
        "",
        "| database | server workers | plan cache | operation | clients | requests | errors "
        "| req/s | p50 ms | p99 ms | load avg before |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    lines += [f"| {r.db} | {r.workers} | {'on' if r.cache else 'off'} | `{r.operation}` | "
              f"{r.clients} | {r.requests} | {r.errors} | {r.requests_per_s} | {r.p50_ms} | "
              f"{r.p99_ms} | {r.load1} |" for r in results]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", action="append", choices=["sqlite", "postgresql"])
    parser.add_argument("--clients", action="append", type=int)
    parser.add_argument("--workers", action="append", type=int)
    parser.add_argument("--no-cache-runs", action="store_true",
                        help="Also measure plan reads with the plan cache off.")
    parser.add_argument("--operation", action="append", choices=["get", "post"],
                        help="Only these operations (GET /v1/plans/{id}, POST "
                             "/v1/evaluate); default both.")
    parser.add_argument("--duration-s", type=float, default=10.0)
    parser.add_argument("--max-requests", type=int, default=50_000)
    parser.add_argument("--first-answer-runs", type=int, default=5,
                        help="Server starts timed per database and worker count.")
    parser.add_argument("--markdown", type=Path, help="Write the results table here.")
    args = parser.parse_args()
    args.db = args.db or ["sqlite", "postgresql"]
    args.clients = args.clients or [16, 64]
    args.workers = args.workers or [1]
    folder = Path(os.environ.get("TMPDIR", "/tmp"))
    results: list[RunResult] = []
    first_answers: dict[str, list[float]] = {}
    for kind in args.db:
        for workers in args.workers:
            first_answers[f"{kind}, {workers}"] = first_answer_times(
                kind, workers, args.first_answer_runs, folder)
            for cache in ([True, False] if args.no_cache_runs else [True]):
                results += bench_database(kind, args, folder, workers, cache)
    command = "python " + " ".join([str(Path(sys.argv[0]).relative_to(ROOT))
                                    if Path(sys.argv[0]).is_absolute() else sys.argv[0],
                                    *sys.argv[1:]])
    text = markdown(results, first_answers, command)
    print(text)
    if args.markdown:
        args.markdown.write_text(text)


if __name__ == "__main__":
    main()
