"""The Lua scripts' headers agree with the Python that reads their replies, and their
``--!include`` lines all resolve (no Redis: the files only).

A dedup script returns one ASCII digit per claim; the store maps digit ``n`` to member ``n`` of
its enum. The header's ``-- returns`` block lists each code as ``N NAME``: a code added, renamed
or renumbered on one side only would turn one outcome into another without an error.
"""

from __future__ import annotations

import enum
import re
from importlib import resources

import pytest

from eoguard.store.dedup import ClaimResult, DoneResult, ReleaseResult, RenewResult
from eoguard.store.scripts import lua_script

LUA = resources.files("eoguard.store").joinpath("lua")
SCRIPTS = sorted(p.name.removesuffix(".lua") for p in LUA.iterdir() if p.name.endswith(".lua"))
LIBS = sorted(p.name.removesuffix(".lua") for p in LUA.joinpath("lib").iterdir()
              if p.name.endswith(".lua"))
CONTRACTS: dict[str, type[enum.Enum]] = {
    "dedup_claim": ClaimResult,
    "dedup_done": DoneResult,
    "dedup_renew": RenewResult,
    "dedup_release": ReleaseResult,
}
CODE = re.compile(r"^--\s+(\d+)\s+([A-Z][A-Z_]*)\b")
INCLUDE = re.compile(r"^--!include (\w+)$")


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
    assert {name for name in SCRIPTS if name.startswith("dedup_")} == set(CONTRACTS)


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
