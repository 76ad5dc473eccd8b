"""Link profiler figures: point-to-point and all-reduce over message sizes, as Markdown.

    python bench/profile_links.py [--world-size 2] [--device cpu|cuda] [--repeats 20]
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from profiles.link_profiler import DEFAULT_SIZES, link_row, profile_links  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    started = time.perf_counter()
    profile = profile_links(world_size=args.world_size, device=args.device,
                            sizes=DEFAULT_SIZES, repeats=args.repeats)
    wall_s = time.perf_counter() - started
    print(f"machine: {platform.node()}; {platform.platform()}; torch {torch.__version__}; "
          f"backend {profile.backend}, {profile.world_size} processes on {profile.device}")
    print(f"date: {dt.datetime.now(dt.UTC).isoformat(timespec='seconds')}")
    print(f"command: python bench/profile_links.py {' '.join(sys.argv[1:])}")
    print(f"profiling time: {wall_s:.1f} s for {len(profile.points)} sizes\n")
    print("| bytes | p2p one-way us | p2p GB/s | all-reduce us | algbw GB/s | busbw GB/s |")
    print("|---|---|---|---|---|---|")
    for p in profile.points:
        print(f"| {p.size_bytes} | {p.p2p_one_way_us:.1f} | {p.p2p_gb_per_s:.4f} | "
              f"{p.allreduce_us:.1f} | {p.allreduce_algbw_gb_per_s:.4f} | "
              f"{p.allreduce_busbw_gb_per_s:.4f} |")
    print(f"\nlink row: {link_row(profile, scope='inter_node')}")


if __name__ == "__main__":
    main()
