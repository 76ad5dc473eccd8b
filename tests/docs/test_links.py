"""Links between the repository's Markdown files lead somewhere: the file exists and, for
`file.md#anchor`, a heading of that file has the anchor (GitHub's rule: lower case,
punctuation dropped, spaces to hyphens). The formats are in docs/formats.md, nowhere else."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#+ (.+)$", re.MULTILINE)


def markdown_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.split()
    return [ROOT / name for name in listed if (ROOT / name).exists()]


def anchor(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.DOTALL)
    return {anchor(h) for h in HEADING.findall(text)}


def broken_links(path: Path) -> list[str]:
    broken = []
    for target in LINK.findall(path.read_text()):
        if re.match(r"^[a-z]+:", target):
            continue  # http:, https:, mailto:
        file_part, _, fragment = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{target} (no such file)")
        elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
            broken.append(f"{target} (no heading with that anchor)")
    return broken


def test_the_anchor_rule_matches_githubs() -> None:
    assert anchor("`GpuType`: a kind of GPU (`gpu_types.<name>`)") == \
        "gputype-a-kind-of-gpu-gpu_typesname"
    assert anchor("Cost in US dollars (version 1.1)") == "cost-in-us-dollars-version-11"


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path) -> None:
    assert not broken_links(path), f"{path.relative_to(ROOT)}: {broken_links(path)}"


def test_no_markdown_file_or_openapi_text_sends_readers_to_a_file_outside_the_repo() -> None:
    snapshot = (ROOT / "tests" / "api" / "openapi.snapshot.json").read_text()
    texts = {str(p.relative_to(ROOT)): p.read_text() for p in markdown_files()}
    texts["OpenAPI document"] = json.dumps(json.loads(snapshot))
    mentioning = sorted(name for name, text in texts.items() if "COST_MODEL" in text)
    assert not mentioning, f"these point to COST_MODEL.md instead of docs/formats.md: {mentioning}"
