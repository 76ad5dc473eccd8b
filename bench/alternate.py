"""Planning time of two versions of the code, side by side in one run.

This VM's speed drifts by 20-40% from minute to minute, so two `bench/plan_time.py` runs a
few minutes apart can disagree by more than a change is worth. Here each round plans every
input once with each version, in fresh processes, the order of the two flipping from one
round to the next; a change shows in the paired ratios (after / before of the same round),
whose median and spread are printed, and in whether the plans' samples/s stay the same.

The version before is checked out from git into a temporary worktree (removed at the end)
and put first on PYTHONPATH of its processes; the version after is this checkout.

Usage: python bench/alternate.py --before REV [--bases A,B] [--size 512] [--rounds 7]
       [--schedules LIST] [--recompute] [--local]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from plan_time import BASES, speed_index

ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def worktree(rev: str) -> Iterator[Path]:
    """A detached checkout of `rev`, removed on the way out."""
    with tempfile.TemporaryDirectory(prefix="hetplan-before-") as parent:
        path = Path(parent) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet",
                        str(path), rev], check=True)
        try:
            yield path
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)],
                           check=False)


def one_run(root: Path, name: str, size: int, options: list[str]) -> dict[str, float]:
    """`plan_time.py --child` of the code under `root`, in a fresh process."""
    env = dict(os.environ, PYTHONPATH=str(root))
    out = subprocess.run([sys.executable, str(root / "bench" / "plan_time.py"), "--child",
                          name, str(size), *options], capture_output=True, text=True,
                         timeout=1800, env=env, cwd=tempfile.gettempdir(), check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", required=True, help="git revision of the code before")
    parser.add_argument("--bases", default=",".join(BASES))
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--schedules", default=None)
    parser.add_argument("--recompute", action="store_true")
    parser.add_argument("--local", action="store_true")
    args = parser.parse_args()
    options = ([] if args.schedules is None else ["--schedules", args.schedules]) + (
        ["--recompute"] if args.recompute else []) + (["--local"] if args.local else [])
    print(f"machine: {platform.machine()}, Python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}, before {args.before}, {args.rounds} rounds at "
          f"~{args.size} GPUs, options {' '.join(options) or 'none'}, "
          f"speed index {speed_index():.2f} s\n")
    print("| base scenario | before: median s | after: median s | after / before, paired "
          "median (range) | samples/s before / after |")
    print("|---|---|---|---|---|")
    with worktree(args.before) as before:
        for name in args.bases.split(","):
            runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
            for round_ in range(args.rounds):
                order = [("before", before), ("after", ROOT)]
                for label, root in order if round_ % 2 == 0 else order[::-1]:
                    runs[label].append(one_run(root, name, args.size, options))
            walls = {label: [r["wall_s"] for r in rs] for label, rs in runs.items()}
            ratios = [a / b for a, b in zip(walls["after"], walls["before"], strict=True)]
            rates = {label: {round(r["samples_per_s"], 4) for r in rs}
                     for label, rs in runs.items()}
            print(f"| {name} | {statistics.median(walls['before']):.3f} | "
                  f"{statistics.median(walls['after']):.3f} | {statistics.median(ratios):.3f} "
                  f"({min(ratios):.2f}-{max(ratios):.2f}) | "
                  f"{'/'.join(map(str, sorted(rates['before'])))} / "
                  f"{'/'.join(map(str, sorted(rates['after'])))} |", flush=True)
    print(f"\nspeed index after the runs: {speed_index():.2f} s")


if __name__ == "__main__":
    main()
