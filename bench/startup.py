"""Start-up times a user feels, and the plan viewer's page load (BENCHMARKS.md section 7).

    python bench/startup.py [--runs N] [--skip-browser]

    python bench/startup.py --plans-512 [--runs N] [--code PATH ...] [--cached-bytecode]

Prints, each over N fresh processes (best and median of wall time):
- `hetplan --help`;
- `hetplan plan` on the README scenario (tests/data/scenarios/a80x16-v32x16-gpt1.3b.json,
  --time-limit 10), whole process;
- `hetplan serve` on a fresh SQLite database until its first answer to GET /healthz;
and, with Chromium installed, the load of /ui/plans/{id} for a 512-GPU plan (the README
scenario's nodes repeated 16 times), from navigation until every chart has drawn.

With --plans-512, instead: `hetplan plan` as a whole process on the 512-GPU inputs of
bench/plan_time.py, beside the search's own seconds (its summary's "searched in"), so that
what start-up and exit add shows. Each --code names a checkout whose `api` and `planner`
the commands run (on PYTHONPATH; default this one): several are run in turn, run by run,
since this VM's speed drifts. --cached-bytecode lets Python keep compiled modules (in a
temporary folder, filled by a first run) where the environment says not to
(PYTHONDONTWRITEBYTECODE), as an installed package has them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the viewer load reuses the tests' server and browser helpers
SCENARIO = ROOT / "tests" / "data" / "scenarios" / "a80x16-v32x16-gpt1.3b.json"
HETPLAN = [sys.executable, "-c", "from api.cli import main; main()"]


def timed(command: list[str], runs: int, **kwargs: object) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, cwd=ROOT, check=True, capture_output=True, **kwargs)  # type: ignore[call-overload]
        times.append(time.perf_counter() - start)
    return times


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def serve_first_answer(runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        folder = Path(tempfile.mkdtemp())
        port = free_port()
        env = {**os.environ, "HETPLAN_DATABASE_URL": f"sqlite:///{folder / 'fresh.db'}"}
        start = time.perf_counter()
        server = subprocess.Popen([*HETPLAN, "serve", "--port", str(port), "--log-level",
                                   "warning"], cwd=ROOT, env=env)
        try:
            while True:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.01)
            times.append(time.perf_counter() - start)
        finally:
            server.terminate()
            server.wait()
            shutil.rmtree(folder, ignore_errors=True)
    return times


def scenario_512() -> dict[str, object]:
    scenario = json.loads(SCENARIO.read_text())
    nodes = scenario["cluster"]["nodes"]
    scenario["cluster"]["nodes"] = [{**node, "name": f"{node['name']}-r{r}"}
                                    for r in range(16) for node in nodes]
    scenario["job"]["global_batch_size"] = 8192
    return scenario


def viewer_load(runs: int) -> tuple[list[float], int]:
    from playwright.sync_api import sync_playwright

    from tests.browser.conftest import chromium_executable
    from tests.live_server import serving

    executable = chromium_executable()
    if executable is None:
        raise SystemExit("no Chromium: install it (apt-get install chromium) or pass "
                         "--skip-browser")
    with tempfile.TemporaryDirectory() as folder, serving(Path(folder) / "v.db") as url:
        answer = httpx.post(f"{url}/v1/plans", json={"scenario": scenario_512(),
                                                      "options": {"time_limit_s": 5}},
                            timeout=120).json()
        gpus = sum(len(s["gpus"]) for p in answer["plan"]["pipelines"] for s in p["stages"])
        times = []
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=executable,
                                                 args=["--no-sandbox"])
            page = browser.new_page()
            for _ in range(runs):
                start = time.perf_counter()
                page.goto(f"{url}/ui/plans/{answer['id']}")
                page.wait_for_function("[...document.querySelectorAll('.figure')]"
                                       ".every(f => f.querySelector('.main-svg'))")
                times.append(time.perf_counter() - start)
            browser.close()
    return times, gpus


def plans_512(runs: int, codes: list[Path], cached_bytecode: bool) -> None:
    """Whole `hetplan plan` processes at 512 GPUs against the search's own seconds."""
    sys.path.insert(0, str(ROOT / "bench"))
    from plan_time import BASES, scaled

    env = dict(os.environ)
    folder = Path(tempfile.mkdtemp())
    if cached_bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(folder / "pycache")
    inputs = []
    for name in BASES:
        path = folder / f"{name}-512.json"
        path.write_text(json.dumps(scaled(name, 512)))
        inputs.append((name, path))
    whole: dict[tuple[str, Path], list[float]] = {}
    searched: dict[tuple[str, Path], list[float]] = {}
    try:
        for run in range(runs + (1 if cached_bytecode else 0)):
            for name, path in inputs:
                for code in codes:
                    start = time.perf_counter()
                    done = subprocess.run([*HETPLAN, "plan", str(path), "-o", os.devnull],
                                          cwd=folder, check=True, capture_output=True, text=True,
                                          env={**env, "PYTHONPATH": str(code)})
                    seconds = time.perf_counter() - start
                    if cached_bytecode and run == 0:
                        continue  # the run that compiled the modules
                    found = re.search(r"searched in ([0-9.]+) s", done.stderr)
                    assert found is not None, done.stderr
                    whole.setdefault((name, code), []).append(seconds)
                    searched.setdefault((name, code), []).append(float(found.group(1)))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print("| input (512 GPUs) | code | whole process best / median s | search best / median s "
          "| rest (median of whole - search) s | runs |\n|---|---|---|---|---|---|")
    for (name, code), times in whole.items():
        spent = searched[(name, code)]
        rest = statistics.median(w - s for w, s in zip(times, spent, strict=True))
        print(f"| {name} | {code} | {min(times):.2f} / {statistics.median(times):.2f} | "
              f"{min(spent):.2f} / {statistics.median(spent):.2f} | {rest:.2f} | {len(times)} |")


def report(name: str, times: list[float]) -> None:
    print(f"| {name} | {min(times):.2f} | {statistics.median(times):.2f} | {len(times)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--skip-browser", action="store_true")
    parser.add_argument("--plans-512", action="store_true",
                        help="time whole `hetplan plan` processes on 512-GPU inputs instead")
    parser.add_argument("--code", type=Path, action="append",
                        help="a checkout whose code the commands run (repeatable)")
    parser.add_argument("--cached-bytecode", action="store_true")
    args = parser.parse_args()
    if args.plans_512:
        plans_512(args.runs, args.code or [ROOT], args.cached_bytecode)
        return
    print("| what | best s | median s | runs |\n|---|---|---|---|")
    report("hetplan --help", timed([*HETPLAN, "--help"], args.runs))
    report("hetplan plan (README scenario, --time-limit 10)",
           timed([*HETPLAN, "plan", str(SCENARIO), "--time-limit", "10", "-o", os.devnull],
                 args.runs))
    report("hetplan serve: first answer, fresh SQLite", serve_first_answer(args.runs))
    if not args.skip_browser:
        times, gpus = viewer_load(args.runs)
        report(f"viewer page load, 512-GPU cluster, plan using {gpus} (all charts drawn)",
               times)


if __name__ == "__main__":
    main()
