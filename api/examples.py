"""The request examples of the OpenAPI document, one story: posted in the order of
`STORY` on an empty database, they register two GPU types, the model, the links, a
profile batch per GPU type and the cluster, and the plan request then answers 201.
The plan request is shown again with options a user may add (`OPTION_VARIANTS`).

The README's HTTP walk-through tells the same story with the same numbers (those of
tests/api/data/scenario.json: 16 A100-80G and 16 V100-32G training GPT 1.3B); a test
posts `STORY` in order and checks both.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib.resources import files
from typing import Any

from fastapi.openapi.models import Example

__all__ = ["OPTION_VARIANTS", "STORY", "StoryStep", "openapi_examples"]


@dataclass(frozen=True)
class StoryStep:
    path: str
    title: str
    body: dict[str, Any]


def _load_story() -> list[StoryStep]:
    story = json.loads((files("api") / "example_story.json").read_text())
    return [
        *(StoryStep("/v1/gpu-types", gpu["name"], gpu) for gpu in story["gpu_types"]),
        StoryStep("/v1/models", story["model"]["name"], story["model"]),
        StoryStep("/v1/links", "NVLink per GPU type and the fabric between nodes",
                  story["links"]),
        *(StoryStep("/v1/profiles", f"{batch['model']} on {batch['gpu_type']}", batch)
          for batch in story["profiles"]),
        StoryStep("/v1/clusters", story["cluster"]["name"], story["cluster"]),
        StoryStep("/v1/plans", f"{story['plan']['model']} on {story['plan']['cluster']}",
                  story["plan"]),
    ]


STORY = _load_story()


def _option_variants() -> list[StoryStep]:
    """The story's plan request again, each with options a user may add to it."""
    plan = next(step for step in STORY if step.path == "/v1/plans")
    widened = {**plan.body, "options": {**plan.body["options"],
                                        "schedules": ["1f1b", "interleaved-1f1b"],
                                        "recompute": True}}
    return [StoryStep("/v1/plans", "The same plan, interleaving and recomputation allowed",
                      widened)]


OPTION_VARIANTS = _option_variants()
"""Requests posted after the story that show its plan request with further options."""


def openapi_examples(path: str) -> dict[str, Example]:
    """The story's bodies for `POST path`, named by what they register, in story order,
    then its option variants."""
    examples = {step.title: Example(summary=f"Step {i + 1} of the README's example: "
                                            f"{step.title}", value=step.body)
                for i, step in enumerate(STORY) if step.path == path}
    examples.update((step.title, Example(summary=f"After the README's example: {step.title}",
                                         value=step.body))
                    for step in OPTION_VARIANTS if step.path == path)
    return examples
