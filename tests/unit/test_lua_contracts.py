"""The Lua scripts' headers agree with their Python bindings, and their ``--!include`` lines
all resolve (no Redis: the files only).

Each header states the script's contract in a grammar this test parses::

    -- KEYS[<position>] = <field>: what it is      one line per field, KEYS in order
    -- ARGV[<position>] = <field>: what it is      then ARGV in order
    -- returns = {<field>, <field>...}: ...        or ``-- returns = <field>: ...`` (one value)

with continuation lines indented under an entry, and inside an entry ``[<row>: <field>, ...]``
for each group of items a rest field or the reply repeats. The binding
(``eoguard/store/bindings``) declares the same: its layout renders every position, index
arithmetic included (``ARGV[4+3j]``), so a field added, renamed or moved on one side only, or
a position that no longer follows from the fields before it, fails here instead of shifting
every argument after it. A dedup script returns one ASCII digit per claim, digit ``n`` being
member ``n`` of its binding's result enum; the ``-- returns`` block lists each code as
``N NAME``, so a code added, renamed or renumbered on one side only fails too.
"""

from __future__ import annotations

import enum
import re
from importlib import resources
from typing import NamedTuple

import pytest

from eoguard.store.bindings import BINDINGS
from eoguard.store.bindings.layout import Contract
from eoguard.store.scripts import lua_script

LUA = resources.files("eoguard.store").joinpath("lua")
SCRIPTS = sorted(p.name.removesuffix(".lua") for p in LUA.iterdir() if p.name.endswith(".lua"))
LIBS = sorted(p.name.removesuffix(".lua") for p in LUA.joinpath("lib").iterdir()
              if p.name.endswith(".lua"))
BOUND: dict[str, Contract] = {b.contract.script: b.contract for b in BINDINGS}
CONTRACTS: dict[str, type[enum.Enum]] = {
    name: contract.returns.codes for name, contract in BOUND.items() if contract.returns.codes}
CODE = re.compile(r"^--\s+(\d+)\s+([A-Z][A-Z_]*)\b")
INCLUDE = re.compile(r"^--!include (\w+)$")
STARTS_ENTRY = re.compile(r"^-- (?:(?:KEYS|ARGV|returns)\b|\S+ +=)")  # or looks like one
ENTRY = re.compile(r"^-- (KEYS|ARGV)\[([^\]\s]+)\] += (\w+)(?::|$)")
RETURNS = re.compile(r"^-- returns += (\{[\w., ]*\}|\w+)(?::|$)")
ROW = re.compile(r"\[(\w+): ([\w., ]*)\]")
ASKS = "or {'?', key, ...}"


class Entry(NamedTuple):
    """One entry of a header: KEYS or ARGV (with its position) or returns (its shape)."""

    kind: str
    position: str
    field: str
    text: str  # the entry's lines, its continuation lines included


def entries(name: str) -> list[Entry]:
    """The header's entries, in order; a line that opens one off the grammar fails the test."""
    found: list[Entry] = []
    open_entry = False
    for line in header(name):
        if STARTS_ENTRY.match(line):
            if keyed := ENTRY.match(line):
                found.append(Entry(keyed.group(1), keyed.group(2), keyed.group(3), line))
            elif shape := RETURNS.match(line):
                found.append(Entry("returns", "", shape.group(1), line))
            else:
                raise AssertionError(f"{name}.lua: not an entry of the header grammar: {line!r}")
            open_entry = True
        elif open_entry and line.startswith("--  "):
            found[-1] = found[-1]._replace(text=f"{found[-1].text} {line[2:].strip()}")
        else:
            open_entry = False
    return found


def rows(text: str) -> list[str]:
    """The ``[row: field, ...]`` groups an entry's text declares, as the binding renders them."""
    return [f"[{row.group(1)}: {row.group(2)}]" for row in ROW.finditer(text)]


def header(name: str) -> list[str]:
    """The comment lines a script opens with."""
    lines = []
    for line in LUA.joinpath(f"{name}.lua").read_text("utf-8").splitlines():
        if not line.startswith("--"):
            break
        lines.append(line)
    return lines


def returned_codes(name: str) -> list[tuple[int, str]]:
    """The ``N NAME`` lines of the header's ``-- returns`` block (up to a bare ``--``)."""
    lines = header(name)
    starts = [i for i, line in enumerate(lines) if line.startswith("-- returns")]
    assert len(starts) == 1, f"{name}.lua: one '-- returns' line in its header, got {len(starts)}"
    codes = []
    for line in lines[starts[0] + 1:]:
        if line.strip() == "--":
            break
        found = CODE.match(line)
        if found:
            codes.append((int(found.group(1)), found.group(2)))
    return codes


def test_every_dedup_script_is_checked() -> None:
    # dedup_open answers with the clock and a flag, not a code per claim
    assert {name for name in SCRIPTS if name.startswith("dedup_")} - {"dedup_open"} \
        == set(CONTRACTS)


def test_every_script_has_one_binding() -> None:
    assert sorted(BOUND) == SCRIPTS
    assert len(BINDINGS) == len(BOUND)


@pytest.mark.parametrize("name", SCRIPTS)
def test_header_states_keys_then_argv_then_returns(name: str) -> None:
    kinds = [entry.kind for entry in entries(name)]
    assert kinds == sorted(kinds, key=["KEYS", "ARGV", "returns"].index)


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("kind", ["KEYS", "ARGV"])
def test_keys_and_argv_entries_are_the_bindings_fields_in_order(name: str, kind: str) -> None:
    layout = BOUND[name].keys if kind == "KEYS" else BOUND[name].argv
    stated = [entry for entry in entries(name) if entry.kind == kind]
    print(f"{name}.lua {kind}: {[(e.position, e.field) for e in stated]}")
    assert [(e.position, e.field) for e in stated] == layout.entries()
    for entry in stated:  # a rest field's rows: [command: name, key, argc, args...]
        assert rows(entry.text) == [row.text for row in layout.rows(entry.field)], entry.field


@pytest.mark.parametrize("name", SCRIPTS)
def test_returns_entry_is_the_bindings_reply(name: str) -> None:
    returns = BOUND[name].returns
    stated = [entry for entry in entries(name) if entry.kind == "returns"]
    assert len(stated) == 1, f"{name}.lua: one '-- returns' entry in its header"
    assert stated[0].field == returns.shape
    assert rows(stated[0].text) == [row.text for row in returns.rows]
    # A script that may ask for undeclared keys says so, and reads them with lib/undeclared.
    assert (ASKS in stated[0].text) == returns.asks
    assert ("--!include undeclared" in LUA.joinpath(f"{name}.lua").read_text("utf-8")) \
        == returns.asks
    if not returns.codes:
        assert returned_codes(name) == []  # codes listed with no enum to read them


@pytest.mark.parametrize("name", sorted(CONTRACTS))
def test_returned_codes_match_the_python_enum(name: str) -> None:
    codes = returned_codes(name)
    want = [(member.value, member.name) for member in CONTRACTS[name]]
    print(f"{name}.lua: {len(codes)} codes: {codes}")
    assert sorted(codes) == sorted(want)
    assert len({number for number, _ in codes}) == len(codes)  # no number twice
    # One ASCII digit per code, and the enum in code order: the store indexes it by digit.
    assert [member.value for member in CONTRACTS[name]] == list(range(len(want)))
    assert len(want) <= 10


@pytest.mark.parametrize("name", SCRIPTS)
def test_includes_name_lib_files_and_are_all_expanded(name: str) -> None:
    text = LUA.joinpath(f"{name}.lua").read_text("utf-8")
    includes = [line for line in text.splitlines() if "--!include" in line]
    for line in includes:
        found = INCLUDE.match(line)
        assert found, f"{name}.lua: malformed include line {line!r}"
        assert found.group(1) in LIBS, f"{name}.lua includes lib/{found.group(1)}.lua: missing"
    source = lua_script(name).source
    assert "--!include" not in source
    for line in includes:  # each part's text is in the script, in place of its line
        part = LUA.joinpath(f"lib/{line.split()[1]}.lua").read_text("utf-8").rstrip("\n")
        assert part in source


def test_every_lib_file_is_included_somewhere() -> None:
    used = {found.group(1) for name in SCRIPTS
            for line in LUA.joinpath(f"{name}.lua").read_text("utf-8").splitlines()
            if (found := INCLUDE.match(line))}
    assert set(LIBS) == used
