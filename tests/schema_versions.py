"""Two versions of the example Order schema, and schema directories holding both.

``older`` is ``schemas/order.avsc`` as shipped; ``newer`` adds ``gift_wrap`` (with a default)
and removes ``note``. :func:`schema_dir` lays out a directory as a user would after an
upgrade: the chosen version current (``order.avsc``), the other under ``history/``.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any, Literal

ROOT = Path(__file__).resolve().parents[1]
SCHEMAS = ROOT / "schemas"
ORDER = "eoguard.example.Order"
Version = Literal["older", "newer"]


def order_schema(version: Version) -> dict[str, Any]:
    """The Order schema JSON of ``version``."""
    schema: dict[str, Any] = json.loads((SCHEMAS / "order.avsc").read_text())
    if version == "older":
        return schema
    newer = copy.deepcopy(schema)
    newer["fields"] = [f for f in newer["fields"] if f["name"] != "note"]
    newer["fields"].append({"name": "gift_wrap", "type": "boolean", "default": False,
                            "doc": "Added in the newer version, with a default."})
    return newer


def schema_dir(root: Path, current: Version) -> Path:
    """A copy of ``schemas/`` with ``current`` as the Order schema and the other in history."""
    target = root / f"schemas-{current}"
    if not target.exists():
        shutil.copytree(SCHEMAS, target)
        other: Version = "newer" if current == "older" else "older"
        (target / "order.avsc").write_text(json.dumps(order_schema(current), indent=2))
        (target / "history").mkdir(exist_ok=True)
        (target / "history" / f"order_{other}.avsc").write_text(
            json.dumps(order_schema(other), indent=2))
    return target
