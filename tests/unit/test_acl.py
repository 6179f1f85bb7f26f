"""The least-privilege rules (eoguard/store/acl.py) and the example docs/operations.md gives."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from eoguard.store import acl
from eoguard.store.acl import RUNTIME_COMMANDS, acl_rules
from eoguard.store.scripts import all_scripts, lua_script

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
CALL = re.compile(r"""redis\.p?call\s*\(\s*(['"])([A-Za-z]+)\1""")
ANY_CALL = re.compile(r"redis\.p?call\b")
# Calls whose command is not a literal, per script: dedup_done's redis.pcall(cmd[1], ...) (from
# lua/lib/effects.lua) runs a handler's effects, whose commands the caller grants (acl_rules'
# ``effects``).
BY_NAME = {"dedup_done": 1}
BY_EFFECTS_ONLY = {"HGET"}  # lib/effects.lua reads a hash field before ctx.tx.hincrby's HINCRBY


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


def test_every_command_a_script_runs_is_granted() -> None:
    """Redis checks a user's rights on each command a script runs: a command a script gains
    must be added to RUNTIME_COMMANDS (or, run for an effect alone, named beside it)."""
    called: dict[str, set[str]] = {}
    for script in all_scripts():  # each as Redis runs it, its lua/lib parts included
        text = lua_script(script).source
        names = [name for _, name in CALL.findall(text)]
        unread = len(ANY_CALL.findall(text)) - len(names)  # calls naming no literal command
        assert unread == BY_NAME.get(script, 0), f"{script}: {unread} calls unread"
        for name in names:
            called.setdefault(name.upper(), set()).add(script)
    assert len(called) > 10, f"the pattern found too few commands: {sorted(called)}"
    missing = {name: sorted(where) for name, where in called.items()
               if name not in RUNTIME_COMMANDS and name not in BY_EFFECTS_ONLY}
    assert not missing, f"scripts run commands the least-privilege user lacks: {missing}"
    acl_doc = inspect.getsource(acl)
    for name in BY_EFFECTS_ONLY:  # RUNTIME_COMMANDS's docstring names what effects add
        assert re.search(rf"``{name}``", acl_doc), f"eoguard/store/acl.py does not name {name}"
    print(f"{len(called)} commands run by scripts, all granted: {sorted(called)}")
