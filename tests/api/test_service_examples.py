"""The OpenAPI examples tell one story, the README's: posted in order on an empty
database they register everything a plan needs, and the plan request answers 201."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from api.examples import OPTION_VARIANTS, STORY
from tests.api.conftest import DATA, profile_rows

README = Path(__file__).parents[2] / "README.md"


def readme_bodies() -> list[Any]:
    """The JSON bodies the README's walk-through sends with `curl -d '...'`."""
    return [json.loads(body) for body in re.findall(r"-d '(\{.*?\})'", README.read_text(),
                                                    flags=re.DOTALL)]


def test_posting_the_examples_in_order_on_an_empty_database_ends_in_a_plan(
        client: TestClient) -> None:
    answers = [client.post(step.path, json=step.body) for step in STORY]
    assert [a.status_code for a in answers] == [201] * len(STORY), [a.text for a in answers]
    plan = answers[-1].json()
    assert plan["evaluation"]["valid"] is True
    assert plan["sources"]["cluster"]["name"] == "lab"


def test_every_story_body_is_the_example_of_its_operation(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    for path in {step.path for step in STORY}:
        content = paths[path]["post"]["requestBody"]["content"]["application/json"]
        shown = [example["value"] for example in content["examples"].values()]
        assert shown == [step.body for step in [*STORY, *OPTION_VARIANTS]
                         if step.path == path], path


def test_the_option_variants_posted_after_the_story_plan_within_their_options(
        client: TestClient) -> None:
    for step in STORY:
        assert client.post(step.path, json=step.body).status_code == 201
    assert OPTION_VARIANTS
    for step in OPTION_VARIANTS:
        answer = client.post(step.path, json=step.body)
        assert answer.status_code == 201, answer.text
        allowed = step.body["options"].get("schedules") or ["1f1b"]
        assert answer.json()["plan"].get("schedule", "1f1b") in allowed
        assert answer.json()["evaluation"]["valid"] is True
        assert answer.json()["options"]["recompute"] is step.body["options"]["recompute"]


def test_the_story_registers_both_gpu_types_of_the_cluster_and_every_layer_kind() -> None:
    bodies = {step.path: [s.body for s in STORY if s.path == step.path] for step in STORY}
    cluster_types = {node["gpu_type"] for node in bodies["/v1/clusters"][0]["nodes"]}
    assert {gpu["name"] for gpu in bodies["/v1/gpu-types"]} == cluster_types
    assert {batch["gpu_type"] for batch in bodies["/v1/profiles"]} == cluster_types
    kinds = set(bodies["/v1/models"][0]["kinds"])
    for batch in bodies["/v1/profiles"]:
        assert {row["kind"] for row in batch["rows"]} == kinds


def test_the_story_has_the_readmes_numbers() -> None:
    scenario = json.loads((DATA / "scenario.json").read_text())
    by_path = {step.path: [s.body for s in STORY if s.path == step.path] for step in STORY}
    gpu_types, links, plan = (readme_bodies()[:2], readme_bodies()[2], readme_bodies()[3])
    assert by_path["/v1/gpu-types"] == gpu_types
    assert by_path["/v1/links"] == [links]
    assert by_path["/v1/plans"] == [plan]
    assert by_path["/v1/models"] == [scenario["model"]]
    assert by_path["/v1/clusters"] == [{"name": "lab", "nodes": scenario["cluster"]["nodes"]}]
    assert [batch["rows"] for batch in by_path["/v1/profiles"]] == [
        profile_rows(scenario, gpu_type) for gpu_type in scenario["gpu_types"]]
