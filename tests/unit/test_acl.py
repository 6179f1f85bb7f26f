"""The least-privilege rules (eoguard/store/acl.py) and the example docs/operations.md gives."""

from __future__ import annotations

import re
from pathlib import Path

from eoguard.store.acl import RUNTIME_COMMANDS, acl_rules

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def test_the_rules_name_the_prefix_keys_and_the_commands_only() -> None:
    rules = acl_rules("orders", effects=["INCRBY"])
    assert rules[:4] == ["resetkeys", "~orders:*", "resetchannels", "-@all"]
    assert rules[4:] == [f"+{c.lower()}" for c in (*RUNTIME_COMMANDS, "INCRBY")]


def test_the_operations_guide_shows_the_rules_acl_rules_gives() -> None:
    text = OPERATIONS.read_text()
    block = re.search(r"```\n(ACL SETUSER orders-app on >PASSWORD .*?)```", text, re.S)
    assert block is not None, "docs/operations.md lost its ACL SETUSER example"
    shown = block.group(1).split()[5:]  # after ACL SETUSER orders-app on >PASSWORD
    assert shown == acl_rules("orders", effects=["INCRBY"])
