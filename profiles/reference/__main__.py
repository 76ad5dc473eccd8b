"""Regenerate the bundled `rows-<model>.json` files: `python -m profiles.reference`."""

from __future__ import annotations

import json
from pathlib import Path

from profiles.reference import REFERENCE_MODELS, rows_document


def main() -> None:
    folder = Path(__file__).parent
    for model in REFERENCE_MODELS:
        path = folder / f"rows-{model}.json"
        text = json.dumps(rows_document(model), indent=1) + "\n"
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path} ({len(text)} bytes)")


if __name__ == "__main__":
    main()
