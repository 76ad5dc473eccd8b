"""A training module stand-in for launcher tests: writes the rank environment it was started
with to OUT/rank{RANK}.json (`python -m tests.launcher.rank_probe ... --out OUT`)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def main() -> None:
    out = Path(sys.argv[sys.argv.index("--out") + 1])
    seen = {name: os.environ.get(name) for name in NAMES} | {"argv": sys.argv[1:]}
    (out / f"rank{os.environ['RANK']}.json").write_text(json.dumps(seen))


if __name__ == "__main__":
    main()
