"""Hostile load on the hetplan service on loopback: admission control and bad inputs.

Starts `hetplan serve` (this checkout's code) on 127.0.0.1 with a fresh SQLite file or
PostgreSQL schema and default settings, stores the catalogue of
`tests/api/data/scenario.json` (16 A100 + 16 V100, GPT 1.3B), then

1. sends `--inline-plans` plan requests at once (inline, default time limit), `--rounds`
   times, while a prober asks `/readyz` every 20 ms: every answer must be 201, or 503
   with Retry-After;
2. sends each hostile input once and records its status, time and the server's peak
   resident memory (VmHWM, a high-water mark over the process's life so far);
3. sends `--made-up-methods` requests with invented HTTP methods, then times a scrape
   of `/metrics` and reports its size.

    .venv/bin/python bench/service_hostile.py --db sqlite --db postgresql \
        --markdown bench/RESULTS-hardening.md
"""

from __future__ import annotations

import argparse
import copy
import http.client
import json
import os
import platform
import statistics
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from service_load import ROOT, Server, fresh_database

SCENARIO = json.loads((ROOT / "tests" / "api" / "data" / "scenario.json").read_text())


@dataclass(frozen=True, kw_only=True)
class Answer:
    status: int
    seconds: float
    retry_after: str | None
    size_bytes: int


def call(port: int, method: str, path: str, body: bytes | None = None,
         timeout_s: float = 300) -> Answer:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    started = time.perf_counter()
    try:
        connection.request(method, path, body=body,
                           headers={"content-type": "application/json"} if body else {})
        response = connection.getresponse()
        data = response.read()
        return Answer(status=response.status, seconds=time.perf_counter() - started,
                      retry_after=response.getheader("Retry-After"), size_bytes=len(data))
    finally:
        connection.close()


def post(port: int, path: str, document: Any) -> Answer:
    return call(port, "POST", path, json.dumps(document).encode())


def register(port: int) -> None:
    for name, gpu in SCENARIO["gpu_types"].items():
        post(port, "/v1/gpu-types", {"name": name, **{k: gpu[k] for k in (
            "memory_gib", "peak_tflops", "hourly_usd") if k in gpu}})
    post(port, "/v1/models", SCENARIO["model"])
    post(port, "/v1/clusters", {"name": "lab", "nodes": SCENARIO["cluster"]["nodes"]})
    links = [{"scope": "intra_node", "gpu_type": g, **v}
             for g, v in SCENARIO["cluster"]["intra_node"].items()]
    post(port, "/v1/links", {"links": [*links, {"scope": "inter_node",
                                                **SCENARIO["cluster"]["inter_node"]}]})
    for gpu_type in SCENARIO["gpu_types"]:
        rows = [{k: v for k, v in r.items() if k != "gpu_type"}
                for r in SCENARIO["profiles"] if r["gpu_type"] == gpu_type]
        post(port, "/v1/profiles", {"model": SCENARIO["model"]["name"], "gpu_type": gpu_type,
                                    "rows": rows})


PLAN_BODY = {"cluster": "lab", "model": SCENARIO["model"]["name"],
             "job": SCENARIO["job"]}


def admission(port: int, plans: int) -> dict[str, Any]:
    """`plans` inline plan requests at once, `/readyz` probed every 20 ms meanwhile."""
    answers: list[Answer] = []
    probes: list[Answer] = []
    done = threading.Event()

    def probe() -> None:
        while not done.is_set():
            probes.append(call(port, "GET", "/readyz", timeout_s=10))
            time.sleep(0.02)

    prober = threading.Thread(target=probe)
    prober.start()
    senders = [threading.Thread(target=lambda: answers.append(post(port, "/v1/plans",
                                                                  PLAN_BODY)))
               for _ in range(plans)]
    started = time.perf_counter()
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join()
    wall_s = time.perf_counter() - started
    done.set()
    prober.join()
    statuses = Counter(a.status for a in answers)
    refused = [a for a in answers if a.status in (429, 503)]
    solved = [a.seconds for a in answers if a.status == 201]
    probe_ms = [p.seconds * 1000 for p in probes]
    return {
        "plans": plans, "wall_s": wall_s, "statuses": dict(sorted(statuses.items())),
        "refused_without_retry_after": sum(a.retry_after is None for a in refused),
        "other_statuses": sum(n for s, n in statuses.items() if s not in (201, 429, 503)),
        "solved_p50_s": statistics.median(solved) if solved else 0.0,
        "solved_max_s": max(solved, default=0.0),
        "refused_max_ms": max((a.seconds * 1000 for a in refused), default=0.0),
        "readyz_probes": len(probes),
        "readyz_not_200": sum(p.status != 200 for p in probes),
        "readyz_p99_ms": p99(probe_ms), "readyz_max_ms": max(probe_ms),
    }


def p99(values: list[float]) -> float:
    """Within the samples (`inclusive`), so a short run's p99 never exceeds its max."""
    if len(values) < 2:
        return max(values, default=0.0)
    return statistics.quantiles(values, n=100, method="inclusive")[98]


def _with_layers(count: int) -> dict[str, Any]:
    scenario = copy.deepcopy(SCENARIO)
    scenario["model"]["layers"] = ["embedding", *["block"] * (count - 2), "head"]
    return {"scenario": scenario}


def _with_gpus(count: int) -> dict[str, Any]:
    scenario = copy.deepcopy(SCENARIO)
    nodes = []
    for i in range(count // 1024):
        gpu_type = "A100-80G" if i % 2 == 0 else "V100-32G"
        nodes.append({"name": f"n{i}", "gpu_type": gpu_type, "gpus": 1024})
    scenario["cluster"]["nodes"] = nodes
    return {"scenario": scenario}


def _profile_with_source(source: bytes) -> bytes:
    return (b'{"model": "m", "gpu_type": "g", "rows": [{"kind": "b", "micro_batch": 1, '
            b'"tp": 1, "forward_ms": 1, "backward_ms": 1, "activation_bytes": 1}], '
            b'"source": ' + source + b"}")


HOSTILE: list[tuple[str, str, str, Any]] = [
    ("profile upload, lone surrogate in `source`", "POST", "/v1/profiles",
     _profile_with_source(b'{"host": "\\udfff"}')),
    ("profile upload, NaN in `source`", "POST", "/v1/profiles",
     _profile_with_source(b'{"clock": NaN}')),
    ("plan, 2,000-layer model on 32 GPUs", "POST", "/v1/plans", _with_layers(2000)),
    ("plan, 100,000-layer model on 32 GPUs", "POST", "/v1/plans", _with_layers(100_000)),
    ("plan, 1,000,448-GPU cluster", "POST", "/v1/plans", _with_gpus(1_000_448)),
    ("plan job, 100,000-layer model", "POST", "/v1/plans?job=true", _with_layers(100_000)),
]


def peak_rss_mib(server: Server) -> float:
    """VmHWM of the server process (uvicorn runs the app in it with --workers 1)."""
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def hostile(server: Server) -> list[dict[str, Any]]:
    results = []
    for name, method, path, body in HOSTILE:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        answer = call(server.port, method, path, data)
        results.append({"case": name, "body_bytes": len(data), "status": answer.status,
                        "seconds": answer.seconds, "peak_rss_mib": peak_rss_mib(server)})
    listed = call(server.port, "GET", "/v1/profiles/sets")
    results.append({"case": "then GET /v1/profiles/sets", "body_bytes": 0,
                    "status": listed.status, "seconds": listed.seconds,
                    "peak_rss_mib": peak_rss_mib(server)})
    return results


def made_up_methods(port: int, count: int) -> dict[str, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    started = time.perf_counter()
    for i in range(count):
        connection.request(f"M{i:06d}", "/v1/plans")
        connection.getresponse().read()
    sent_s = time.perf_counter() - started
    connection.close()
    scrape = call(port, "GET", "/metrics")
    return {"requests": count, "sent_s": sent_s, "metrics_bytes": scrape.size_bytes,
            "scrape_ms": scrape.seconds * 1000}


def bench(kind: str, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    url, drop = fresh_database(kind, folder)
    server = Server(database_url=url, workers=1, cache=True)
    try:
        register(server.port)
        rounds = [admission(server.port, args.inline_plans) for _ in range(args.rounds)]
        return {"db": kind, "admission": rounds,
                "hostile": hostile(server),
                "metrics": made_up_methods(server.port, args.made_up_methods)}
    finally:
        server.stop()
        drop()


def markdown(results: list[dict[str, Any]], command: str) -> str:
    lines = ["# Hardening benchmark (bench/service_hostile.py)", "",
             f"- date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
             f"- machine: {platform.node() or 'vm'}, {len(os.sched_getaffinity(0))}"
             f" CPUs ({platform.machine()}), Python {platform.python_version()}",
             "- server: `hetplan serve` of this checkout, 1 process, default settings "
             "(max_inline_solves 4, max_plan_layers 1024, max_plan_gpus 16384)",
             f"- command: `{command}`", "", "## Inline plans at once, `/readyz` probed every "
             "20 ms", "",
             "| database | plans | round | wall s | statuses | 503 without Retry-After | "
             "201 p50 s | 201 max s | refusal max ms | probes | probes not 200 | "
             "readyz p99 ms | readyz max ms |", "| --- " * 13 + "|"]
    for r in results:
        for number, a in enumerate(r["admission"], 1):
            lines.append(
                f"| {r['db']} | {a['plans']} | {number} | {a['wall_s']:.1f} | "
                f"{a['statuses']} | {a['refused_without_retry_after']} | "
                f"{a['solved_p50_s']:.2f} | {a['solved_max_s']:.2f} | "
                f"{a['refused_max_ms']:.1f} | {a['readyz_probes']} | {a['readyz_not_200']} | "
                f"{a['readyz_p99_ms']:.1f} | {a['readyz_max_ms']:.1f} |")
    lines += ["", "## Hostile inputs", "",
              "| database | case | body bytes | status | seconds | server peak RSS MiB |",
              "| --- " * 6 + "|"]
    for r in results:
        for h in r["hostile"]:
            lines.append(f"| {r['db']} | {h['case']} | {h['body_bytes']} | {h['status']} | "
                         f"{h['seconds']:.3f} | {h['peak_rss_mib']:.0f} |")
    lines += ["", "## Made-up HTTP methods, then one `/metrics` scrape", "",
              "| database | requests | sent in s | /metrics bytes | scrape ms |",
              "| --- " * 5 + "|"]
    for r in results:
        m = r["metrics"]
        lines.append(f"| {r['db']} | {m['requests']} | {m['sent_s']:.1f} | "
                     f"{m['metrics_bytes']} | {m['scrape_ms']:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", action="append", choices=["sqlite", "postgresql"])
    parser.add_argument("--inline-plans", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2,
                        help="Bursts of inline plans, one after the other (the first "
                             "starts the search processes; later ones reuse them).")
    parser.add_argument("--made-up-methods", type=int, default=20_000)
    parser.add_argument("--markdown", type=Path, help="Write the results here.")
    args = parser.parse_args()
    folder = Path("/tmp") / "hetplan-bench"
    folder.mkdir(exist_ok=True)
    results = [bench(kind, args, folder) for kind in args.db or ["sqlite"]]
    text = markdown(results, "python bench/service_hostile.py " + " ".join(sys.argv[1:]))
    print(text)
    if args.markdown:
        args.markdown.write_text(text)


if __name__ == "__main__":
    main()
