"""Fault suite for durable jobs: kill -9 the server and the worker at random moments.

Runs this checkout's `hetplan serve` and `hetplan worker` processes on 127.0.0.1, on a
fresh SQLite file or PostgreSQL schema with the catalogue of
`tests/api/data/scenario.json`, then for each database:

- `--trials` server trials, on `hetplan serve` with its embedded worker (the one-command
  set-up): two clients upload profile batches (each with its own Idempotency-Key) and
  queue plan jobs without pause; at a random moment the server's process group (server,
  its worker's search processes) gets SIGKILL, and a new server is started at once.
  Every upload answered 201 before the kill must be stored as answered; every job
  answered 202 must end `succeeded` (or `failed` with an error). Recovery: kill to the
  last of the trial's jobs ending (`ready_s`: the new server's start to `/readyz`).
- `--trials` worker trials, on an API replica (`HETPLAN_EMBEDDED_WORKER=false`) and one
  `hetplan worker`: two plan jobs are queued, and at a random moment in the first half
  second after one starts, the worker's process group (worker, search processes) gets
  SIGKILL; a new worker is started at once. Both jobs must end `succeeded` (or `failed`
  with an error). Recovery: kill to the last of the trial's jobs ending (the lease must
  lapse first).

With `--throughput`, it also times `--jobs` plan jobs run by 1 and then 2 worker
processes (one search each at a time), and with `--sweep-fleets N` as many frontier
jobs of N searches each (`--sweep-jobs`), whose time is mostly search.

    .venv/bin/python bench/service_faults.py --db sqlite --db postgresql --trials 20 \
        --throughput --markdown bench/RESULTS-faults.md
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from service_load import ROOT, free_port, fresh_database

SCENARIO = json.loads((ROOT / "tests" / "api" / "data" / "scenario.json").read_text())
MODEL = SCENARIO["model"]["name"]
PLAN_JOB = {"cluster": "lab", "model": MODEL, "job": SCENARIO["job"]}
FINAL = ("succeeded", "failed", "cancelled")
HETPLAN = [sys.executable, "-c", "from api.cli import main; main()"]


class Process:
    """A child process of this checkout in its own process group (kill -9 takes all)."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        with log.open("ab") as sink:
            self.process = subprocess.Popen([*HETPLAN, *args], env=env, cwd=ROOT,
                                            stdout=sink, stderr=sink, start_new_session=True)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(30)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            self.kill()


@dataclass
class Service:
    """One API server and its workers on one database."""

    database_url: str
    folder: Path
    lease_s: float
    embedded_worker: bool = False
    port: int = field(default_factory=free_port)
    server: Process | None = None
    workers: list[Process] = field(default_factory=list)

    def env(self, **extra: str) -> dict[str, str]:
        env = {**os.environ, "HETPLAN_DATABASE_URL": self.database_url,
               "HETPLAN_EMBEDDED_WORKER": str(self.embedded_worker).lower(),
               "HETPLAN_SOLVER_WORKERS": "2", "HETPLAN_JOB_LEASE_S": str(self.lease_s),
               "HETPLAN_JOB_POLL_S": "0.2", "HETPLAN_MAX_PENDING_JOBS": "1000", **extra}
        env.pop("HETPLAN_TOKENS", None)
        return env

    def start_server(self) -> float:
        """Start the server; seconds until `/readyz` answers 200."""
        started = time.perf_counter()
        self.server = Process(["serve", "--host", "127.0.0.1", "--port", str(self.port),
                               "--log-level", "warning"], self.env(),
                              self.folder / "server.log")
        while time.perf_counter() - started < 120:
            try:
                if call(self.port, "GET", "/readyz", timeout_s=1)[0] == 200:
                    return time.perf_counter() - started
            except OSError:
                time.sleep(0.02)
        raise RuntimeError("the server did not become ready in 120 s; see server.log")

    def start_worker(self, concurrency: int) -> Process:
        worker = Process(["worker", "--concurrency", str(concurrency)], self.env(),
                         self.folder / "worker.log")
        self.workers.append(worker)
        return worker

    def stop(self) -> None:
        for process in [*self.workers, *([self.server] if self.server else [])]:
            process.stop()
        self.workers.clear()


def call(port: int, method: str, path: str, body: Any = None, *, key: str | None = None,
         timeout_s: float = 30) -> tuple[int, Any]:
    headers = {"content-type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                     method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")
    except http.client.HTTPException as error:  # the server died mid-answer: no answer
        raise ConnectionError(f"{method} {path}: {error!r}") from error


def register(port: int) -> None:
    for name, gpu in SCENARIO["gpu_types"].items():
        call(port, "POST", "/v1/gpu-types", {"name": name, **{
            k: gpu[k] for k in ("memory_gib", "peak_tflops", "hourly_usd") if k in gpu}})
    call(port, "POST", "/v1/models", SCENARIO["model"])
    call(port, "POST", "/v1/clusters", {"name": "lab", "nodes": SCENARIO["cluster"]["nodes"]})
    links = [{"scope": "intra_node", "gpu_type": g, **v}
             for g, v in SCENARIO["cluster"]["intra_node"].items()]
    call(port, "POST", "/v1/links", {"links": [*links, {"scope": "inter_node",
                                                         **SCENARIO["cluster"]["inter_node"]}]})
    for gpu_type in SCENARIO["gpu_types"]:
        call(port, "POST", "/v1/profiles", profile_batch(gpu_type, 1.0))


def profile_batch(gpu_type: str, scale: float) -> dict[str, Any]:
    rows = [{**{k: v for k, v in r.items() if k != "gpu_type"},
             "forward_ms": r["forward_ms"] * scale}
            for r in SCENARIO["profiles"] if r["gpu_type"] == gpu_type]
    return {"model": MODEL, "gpu_type": gpu_type, "rows": rows}


def queue_job(port: int, time_limit_s: float, max_fleets: int = 0) -> str | None:
    """A plan job's id (a frontier job's with `max_fleets`) when the server acknowledged
    it (202), else None."""
    path, options = "/v1/plans?job=true", {"time_limit_s": time_limit_s}
    if max_fleets:
        path, options = "/v1/plans/pareto?job=true", {**options, "max_fleets": max_fleets}
    try:
        status, body = call(port, "POST", path, {**PLAN_JOB, "options": options})
    except OSError:
        return None
    return body["id"] if status == 202 else None


def wait_final(port: int, job_ids: list[str], timeout_s: float) -> dict[str, dict[str, Any]]:
    """Each job's final record (a job still unfinished at the timeout is left out)."""
    deadline = time.monotonic() + timeout_s
    final: dict[str, dict[str, Any]] = {}
    while time.monotonic() < deadline and len(final) < len(job_ids):
        for job_id in job_ids:
            if job_id in final:
                continue
            try:
                status, job = call(port, "GET", f"/v1/jobs/{job_id}", timeout_s=5)
            except OSError:
                continue
            if status == 200 and job["status"] in FINAL:
                final[job_id] = job
        time.sleep(0.1)
    return final


def recovery_s(killed: datetime, final: dict[str, dict[str, Any]]) -> float:
    """From the kill to the last of the jobs ending, by the jobs' own `updated_at` (so the
    suite's checks after the restart are not counted)."""
    ended = [datetime.fromisoformat(job["updated_at"]) for job in final.values()]
    return max([(e - killed).total_seconds() for e in ended] + [0.0])


def ended_well(job: dict[str, Any]) -> bool:
    """`succeeded`, or `failed` saying why (an error code and a message)."""
    return job["status"] == "succeeded" or (
        job["status"] == "failed" and bool((job.get("error") or {}).get("message")))


def server_trial(service: Service, rng: random.Random, time_limit_s: float) -> dict[str, Any]:
    uploads: list[dict[str, Any]] = []  # the answer to every acknowledged upload
    jobs: list[str] = []
    stop = threading.Event()

    def upload() -> None:
        while not stop.is_set():
            gpu_type = rng.choice(list(SCENARIO["gpu_types"]))
            batch = profile_batch(gpu_type, 1.0 + rng.random() / 10)
            try:
                status, body = call(service.port, "POST", "/v1/profiles", batch,
                                    key=uuid.uuid4().hex, timeout_s=10)
            except OSError:
                continue
            if status == 201:
                uploads.append(body)

    def submit() -> None:
        while not stop.is_set():
            job_id = queue_job(service.port, time_limit_s)
            if job_id is not None:
                jobs.append(job_id)
            time.sleep(0.2)

    clients = [threading.Thread(target=target) for target in (upload, submit)]
    for client in clients:
        client.start()
    time.sleep(rng.uniform(0.3, 2.0))
    assert service.server is not None
    running = sum(call(service.port, "GET", f"/v1/jobs/{j}")[1]["status"] == "running"
                  for j in list(jobs))
    killed = datetime.now(UTC)
    service.server.kill()
    stop.set()
    for client in clients:
        client.join()
    ready_s = service.start_server()
    missing = 0
    fields = ("id", "model", "gpu_type", "version", "count", "uploaded")
    for acked in uploads:  # stored as acknowledged: same version, same rows
        status, body = call(service.port, "GET", f"/v1/profiles/sets/{acked['id']}?limit=1")
        missing += status != 200 or any(body[f] != acked[f] for f in fields)
    final = wait_final(service.port, jobs, timeout_s=60 + 4 * len(jobs) * time_limit_s)
    return {"kind": "server", "recovery_s": recovery_s(killed, final),
            "ready_s": ready_s, "uploads_acked": len(uploads),
            "uploads_lost": missing, "jobs_acked": len(jobs), "running_at_kill": running,
            "jobs_ended_well": sum(ended_well(j) for j in final.values()),
            "jobs_unfinished": len(jobs) - len(final),
            "max_attempts": max((j["attempts"] for j in final.values()), default=0)}


def worker_trial(service: Service, rng: random.Random, time_limit_s: float,
                 concurrency: int) -> dict[str, Any]:
    jobs = [job_id for job_id in (queue_job(service.port, time_limit_s) for _ in range(2))
            if job_id is not None]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait until the worker runs one of them
        states = [call(service.port, "GET", f"/v1/jobs/{j}")[1]["status"] for j in jobs]
        if "running" in states:
            break
        time.sleep(0.05)
    # a random moment early in the search: this scenario's search often ends well before
    # its time limit, and a kill after it tests nothing
    time.sleep(rng.uniform(0.0, 0.5))
    running = [j for j in jobs
               if call(service.port, "GET", f"/v1/jobs/{j}")[1]["status"] == "running"]
    killed = datetime.now(UTC)
    service.workers.pop().kill()
    service.start_worker(concurrency)
    final = wait_final(service.port, jobs, timeout_s=120)
    return {"kind": "worker", "recovery_s": recovery_s(killed, final),
            "jobs_acked": len(jobs),
            "running_at_kill": len(running),
            "jobs_ended_well": sum(ended_well(j) for j in final.values()),
            "jobs_unfinished": len(jobs) - len(final),
            "max_attempts": max((j["attempts"] for j in final.values()), default=0)}


def faults(kind: str, args: argparse.Namespace, folder: Path) -> list[dict[str, Any]]:
    url, drop = fresh_database(kind, folder)
    service = Service(url, folder, lease_s=args.lease_s, embedded_worker=True)
    rng = random.Random(args.seed)
    try:  # first `hetplan serve` alone, its embedded worker running the jobs
        service.start_server()
        register(service.port)
        trials = []
        for n in range(args.trials):
            trials.append({"db": kind, "trial": n + 1,
                           **server_trial(service, rng, args.time_limit_s)})
            print(json.dumps(trials[-1]), flush=True)
        service.stop()  # then an API replica and a `hetplan worker`
        service.embedded_worker = False
        service.start_server()
        service.start_worker(2)
        for n in range(args.trials):
            trials.append({"db": kind, "trial": n + 1,
                           **worker_trial(service, rng, args.worker_time_limit_s, 2)})
            print(json.dumps(trials[-1]), flush=True)
        return trials
    finally:
        service.stop()
        drop()


def throughput(kind: str, args: argparse.Namespace, folder: Path,
               max_fleets: int = 0) -> list[dict[str, Any]]:
    """Jobs per minute of 1 and 2 worker processes: plan jobs, or frontier jobs of
    `max_fleets` searches each."""
    results = []
    count = args.sweep_jobs if max_fleets else args.jobs
    for processes in (1, 2):
        url, drop = fresh_database(kind, folder)
        service = Service(url, folder, lease_s=args.lease_s)
        try:
            service.start_server()
            register(service.port)
            for _ in range(processes):
                service.start_worker(1)
            warm = queue_job(service.port, args.time_limit_s)  # search servers started
            wait_final(service.port, [warm] if warm else [], timeout_s=120)
            started = time.perf_counter()
            jobs = [queue_job(service.port, args.time_limit_s, max_fleets)
                    for _ in range(count)]
            final = wait_final(service.port, [j for j in jobs if j], timeout_s=600)
            seconds = time.perf_counter() - started
            results.append({"db": kind, "job": f"pareto, max_fleets {max_fleets}" if max_fleets
                            else "plan", "worker_processes": processes, "jobs": count,
                            "succeeded": sum(j["status"] == "succeeded"
                                             for j in final.values()),
                            "seconds": seconds, "jobs_per_min": 60 * len(final) / seconds,
                            "load1": os.getloadavg()[0]})
            print(json.dumps(results[-1]), flush=True)
        finally:
            service.stop()
            drop()
    return results


def ready_p50(rows: list[dict[str, Any]]) -> str:
    ready = [t["ready_s"] for t in rows if "ready_s" in t]
    return f"{statistics.median(ready):.1f}" if ready else "-"


def markdown(trials: list[dict[str, Any]], rates: list[dict[str, Any]], command: str) -> str:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"`{command}` ({when}, {platform.machine()}, {os.cpu_count()} vCPUs, load "
             f"average {os.getloadavg()[0]:.1f} at the end)"]
    if trials:
        lines += ["", "| database | killed | trials | uploads acked | uploads lost | jobs acked "
                  "| jobs ended well | jobs unfinished | jobs running at kill | max attempts | "
                  "recovery p50 s | recovery max s | server ready p50 s |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for db in dict.fromkeys(t["db"] for t in trials):
        for kind in ("server", "worker"):
            rows = [t for t in trials if t["db"] == db and t["kind"] == kind]
            if not rows:
                continue
            # a kill with no job running has no job to recover
            recovery = [t["recovery_s"] for t in rows if t["running_at_kill"]] or [0.0]
            lines.append(
                f"| {db} | {kind} | {len(rows)} | "
                f"{sum(t.get('uploads_acked', 0) for t in rows)} | "
                f"{sum(t.get('uploads_lost', 0) for t in rows)} | "
                f"{sum(t['jobs_acked'] for t in rows)} | "
                f"{sum(t['jobs_ended_well'] for t in rows)} | "
                f"{sum(t['jobs_unfinished'] for t in rows)} | "
                f"{sum(t['running_at_kill'] for t in rows)} | "
                f"{max(t['max_attempts'] for t in rows)} | "
                f"{statistics.median(recovery):.1f} | {max(recovery):.1f} | "
                f"{ready_p50(rows)} |")
    if rates:
        lines += ["", "| database | job | worker processes | jobs | succeeded | seconds | "
                  "jobs/min | load1 before |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        lines += [f"| {r['db']} | {r['job']} | {r['worker_processes']} | {r['jobs']} | "
                  f"{r['succeeded']} | "
                  f"{r['seconds']:.1f} | {r['jobs_per_min']:.1f} | {r['load1']:.1f} |"
                  for r in rates]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", action="append", choices=["sqlite", "postgresql"])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--time-limit-s", type=float, default=1.0,
                        help="Search budget of each plan job.")
    parser.add_argument("--worker-time-limit-s", type=float, default=2.0,
                        help="Search budget of the jobs of worker trials.")
    parser.add_argument("--lease-s", type=float, default=2.0,
                        help="HETPLAN_JOB_LEASE_S of the workers (short: quick takeover).")
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument("--throughput", action="store_true")
    parser.add_argument("--jobs", type=int, default=8, help="Jobs of the throughput run.")
    parser.add_argument("--sweep-fleets", type=int, default=0,
                        help="Also time frontier jobs of this many fleets (0: no).")
    parser.add_argument("--sweep-jobs", type=int, default=6,
                        help="Frontier jobs of that throughput run.")
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--folder", type=Path, default=Path("/tmp/hetplan-faults"))
    args = parser.parse_args()
    args.folder.mkdir(parents=True, exist_ok=True)
    trials: list[dict[str, Any]] = []
    rates: list[dict[str, Any]] = []
    for kind in args.db or ["sqlite"]:
        if args.trials:
            trials += faults(kind, args, args.folder)
        if args.throughput:
            rates += throughput(kind, args, args.folder)
            if args.sweep_fleets:
                rates += throughput(kind, args, args.folder, args.sweep_fleets)
    text = markdown(trials, rates, "python bench/service_faults.py " + " ".join(sys.argv[1:]))
    print(text)
    if args.markdown:
        args.markdown.write_text(text)
    bad = [t for t in trials if t.get("uploads_lost") or t["jobs_unfinished"]
           or t["jobs_ended_well"] != t["jobs_acked"]]
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
