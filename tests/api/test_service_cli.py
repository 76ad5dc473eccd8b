"""`hetplan serve` and `hetplan batch`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

import planner
from api.cli import app
from planner.documents import Schedule
from tests.api.conftest import DATA


def test_serve_without_tokens_on_a_public_address_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HETPLAN_TOKENS", raising=False)
    monkeypatch.delenv("HETPLAN_OPEN", raising=False)
    result = CliRunner().invoke(app, ["serve", "--host", "0.0.0.0", "--port", "1"])
    assert result.exit_code == 2
    assert "refusing to serve" in result.output


def test_batch_plans_every_scenario_and_fails_if_one_fails(tmp_path: Path) -> None:
    scenarios = tmp_path / "scenarios"
    scenarios.mkdir()
    shutil.copy(DATA / "scenario.json", scenarios / "good.json")
    broken = json.loads((DATA / "scenario.json").read_text())
    broken["job"]["global_batch_size"] = 0
    (scenarios / "broken.json").write_text(json.dumps(broken))
    out = tmp_path / "plans"
    result = CliRunner().invoke(app, ["batch", str(scenarios), "--out", str(out),
                                      "--jobs", "2", "--time-limit", "1"])
    assert result.exit_code == 1, result.output
    assert "1 of 2 scenarios failed" in result.output
    summary = {o["scenario"]: o for o in json.loads((out / "batch-summary.json").read_text())}
    assert summary["broken.json"]["ok"] is False
    assert "global_batch_size" in summary["broken.json"]["error"]
    assert summary["good.json"]["ok"] is True
    plan = planner.parse_plan(json.loads((out / "good.plan.json").read_text()))
    scenario = planner.parse_scenario(json.loads((DATA / "scenario.json").read_text()))
    evaluation = planner.evaluate(scenario, plan)
    assert evaluation.valid
    assert evaluation.iteration_s == pytest.approx(summary["good.json"]["iteration_s"])


def test_batch_takes_the_search_options_plan_takes(tmp_path: Path) -> None:
    """A local job capped at 2 blocks and a 1F1B job allowed interleaving and recomputation:
    each plan keeps to its options and is valid."""
    from bench.schedules import with_local_head

    one_f_one_b = json.loads((DATA / "scenario.json").read_text())
    scenarios = tmp_path / "scenarios"
    scenarios.mkdir()
    (scenarios / "local.json").write_text(json.dumps(with_local_head(one_f_one_b)))
    (scenarios / "mixed.json").write_text(json.dumps(one_f_one_b))
    out = tmp_path / "plans"
    result = CliRunner().invoke(app, ["batch", str(scenarios), "--out", str(out), "--jobs", "1",
                                      "--time-limit", "2", "--max-local-blocks", "2", "--json"])
    assert result.exit_code == 0, result.output  # the cap leaves jobs of other schedules be
    local = planner.parse_plan(json.loads((out / "local.plan.json").read_text()))
    assert local.schedule is Schedule.LOCAL
    assert max(len(p.stages) for p in local.pipelines) <= 2  # uncapped: 4 blocks
    widened = CliRunner().invoke(app, ["batch", str(scenarios), "--out", str(out), "--jobs", "1",
                                       "--time-limit", "2", "--schedules",
                                       "1f1b,interleaved-1f1b", "--recompute", "--json"])
    summary = {o["scenario"]: o for o in json.loads(widened.stdout)}
    assert summary["mixed.json"]["ok"] is True
    assert "local" in summary["local.json"]["error"]  # a local job takes only `local`
    mixed = planner.parse_plan(json.loads((out / "mixed.plan.json").read_text()))
    assert planner.evaluate(planner.parse_scenario(one_f_one_b), mixed).valid


def test_batch_of_an_empty_folder_is_an_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["batch", str(tmp_path), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "no scenario files" in result.output


def test_served_connections_have_nagle_turned_off() -> None:
    """Keep-alive answers must not wait for delayed ACKs (40 ms each with --workers)."""
    import asyncio
    import socket

    import uvicorn

    from api.serving import NoDelayHTTPProtocol

    class Transport(asyncio.Transport):
        def __init__(self, sock: socket.socket) -> None:
            super().__init__({"socket": sock, "peername": sock.getpeername(),
                              "sockname": sock.getsockname()})

    with socket.create_server(("127.0.0.1", 0)) as listener, \
            socket.create_connection(listener.getsockname()) as client:
        accepted, _ = listener.accept()
        with accepted:
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
            config = uvicorn.Config(app=None)  # type: ignore[arg-type]
            config.load()
            loop = asyncio.new_event_loop()
            try:
                protocol = NoDelayHTTPProtocol(config=config, server_state=uvicorn.server
                                               .ServerState(), app_state={}, _loop=loop)
                protocol.connection_made(Transport(accepted))
            finally:
                loop.close()
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        del client


def test_serve_answers_on_loopback_after_migrating(tmp_path: Path) -> None:
    """`hetplan serve` for real: a child process, a new database, /readyz within 30 s."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "HETPLAN_DATABASE_URL": f"sqlite:///{tmp_path / 'served.db'}"}
    env.pop("HETPLAN_TOKENS", None)
    hetplan = [sys.executable, "-c", "from api.cli import main; main()"]  # the console script
    process = subprocess.Popen([*hetplan, "serve", "--port", str(port), "--log-level",
                                "warning"], env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, "hetplan serve exited"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                    assert json.loads(r.read()) == {"status": "ok", "database": "sqlite"}
                    break
            except OSError:
                assert time.monotonic() < deadline, "hetplan serve did not answer in 30 s"
                time.sleep(0.05)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(20)
    assert (tmp_path / "served.db").exists()
