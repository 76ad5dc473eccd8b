"""Sweeps of plans give the same plans on local processes, in turn, and as Ray tasks."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

import planner
from api.sweeps import RayUnavailable, local_mapper, ray_mapper, sweep_mapper
from planner import fleet
from planner.documents import dump_document
from tests.planner.fleet_scenarios import priced

HAS_RAY = importlib.util.find_spec("ray") is not None
OPTIONS = planner.SearchOptions(time_limit_s=1.0)


def _sweep() -> list[fleet.Fleet]:
    return fleet.sub_fleets(planner.parse_scenario(priced(2, 2)))


def _plans(outcomes: list[fleet.FleetOutcome]) -> list[object]:
    return [(o.label, None if o.result is None else dump_document(o.result.plan).get("pipelines"))
            for o in outcomes]


def test_local_processes_give_the_plans_of_planning_in_turn() -> None:
    fleets = _sweep()
    in_turn = fleet.plan_fleets(fleets, OPTIONS)
    with local_mapper(2) as mapper:
        on_processes = fleet.plan_fleets(fleets, OPTIONS, mapper=mapper)
    assert _plans(on_processes) == _plans(in_turn)
    assert len(in_turn) == len(fleets) > 3


@pytest.mark.skipif(not HAS_RAY, reason="Ray is not installed (pip install 'hetplan[ray]')")
def test_local_ray_gives_the_plans_of_local_processes() -> None:
    fleets = _sweep()
    with local_mapper(2) as mapper:
        on_processes = fleet.plan_fleets(fleets, OPTIONS, mapper=mapper)
    with sweep_mapper("auto", 2) as mapper:
        on_ray = fleet.plan_fleets(fleets, OPTIONS, mapper=mapper)
    assert _plans(on_ray) == _plans(on_processes)


@pytest.mark.skipif(HAS_RAY, reason="Ray is installed; this checks the error without it")
def test_ray_address_without_ray_installed_says_how_to_install_it() -> None:
    with pytest.raises(RayUnavailable, match=r"hetplan\[ray\]"), ray_mapper("auto", 1):
        pass


def _die_once(marker: str) -> int:
    """Kill the worker the first time it runs (as a lost machine would), answer after."""
    path = Path(marker)
    if not path.exists():
        path.write_text("died once")
        os._exit(1)
    return os.getpid()


@pytest.mark.skipif(not HAS_RAY, reason="Ray is not installed (pip install 'hetplan[ray]')")
def test_a_ray_worker_lost_mid_sweep_costs_only_its_task(tmp_path: Path) -> None:
    markers = [str(tmp_path / f"task-{i}") for i in range(3)]
    with ray_mapper("auto", 2) as mapper:
        answers = list(mapper(_die_once, markers))
    assert len(answers) == 3 and all(Path(m).exists() for m in markers)
