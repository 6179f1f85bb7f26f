"""A script's contract as data: how its KEYS and ARGV are laid out, and what it returns.

A layout is a list of sections, each naming its fields in order. The binding builds its calls
section by section (a section's row is a NamedTuple, so its field order is the order written),
and :meth:`Layout.entries` derives from the same sections the position of every field, index
arithmetic included (``ARGV[4+3j]``: field 1 of group j's row after six fixed ones). The
script's header states each position with the same text (``-- ARGV[4+3j] = record_prefix: ...``)
and tests/unit/test_lua_contracts.py holds the two together, so a field added, renamed or moved
on one side only fails a test instead of shifting every argument after it.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from eoguard.store.scripts import ScriptArg, ScriptCall

__all__ = ["Binding", "Contract", "Each", "Fixed", "Layout", "Rest", "Returns", "Row", "Run"]


@dataclass(frozen=True)
class Row:
    """A group of items that repeats inside a rest field or a reply: ``[command: name, key,
    argc, args...]`` in the header (``rest``: the last field takes the items left)."""

    name: str
    fields: tuple[str, ...]
    rest: bool = False

    @property
    def text(self) -> str:
        return f"[{self.name}: {_names(self.fields, self.rest)}]"


@dataclass(frozen=True)
class Fixed:
    """Fields that come once each, in this order."""

    fields: tuple[str, ...]


@dataclass(frozen=True)
class Run:
    """One field repeated ``count`` times (a symbol: ``g`` groups): ``KEYS[1..g]``."""

    field: str
    count: str


@dataclass(frozen=True)
class Each:
    """A row of fields per item, rows one after the other: field k of row ``index`` (1-based)."""

    fields: tuple[str, ...]
    count: str
    index: str


@dataclass(frozen=True)
class Rest:
    """Every slot left (last): ``ARGV[2+n..]``, made of ``rows`` if it has a structure."""

    field: str
    rows: tuple[Row, ...] = ()


Section = Fixed | Run | Each | Rest
Offset = tuple[int, dict[str, int]]  # a constant, plus a coefficient per symbol


def _names(fields: Sequence[str], rest: bool) -> str:
    return ", ".join([*fields[:-1], fields[-1] + ("..." if rest else "")])


def _render(const: int, terms: dict[str, int]) -> str:
    """A position as a header writes it: ``5+3g+2i`` (symbols in the order they came)."""
    text = "+".join(f"{coef if coef != 1 else ''}{symbol}" for symbol, coef in terms.items() if coef)
    if const and text:
        return f"{const}+{text}" if const > 0 else f"{text}{const}"
    return text or str(const)


def _plus(terms: dict[str, int], symbol: str, coef: int) -> dict[str, int]:
    return {**terms, symbol: terms.get(symbol, 0) + coef}


class Layout:
    """The sections of a script's KEYS or of its ARGV, in order."""

    def __init__(self, *sections: Section) -> None:
        for section in sections[:-1]:
            if isinstance(section, Rest):
                raise ValueError("a Rest section comes last")
        self.sections = sections

    @property
    def fields(self) -> tuple[str, ...]:
        """Every field's name, in order."""
        return tuple(name for _, name in self.entries())

    def rows(self, field: str) -> tuple[Row, ...]:
        """The rows ``field`` is made of (a rest field's), or none."""
        return next((s.rows for s in self.sections if isinstance(s, Rest) and s.field == field), ())

    def entries(self) -> list[tuple[str, str]]:
        """(position, field) of each field, positions written as the header writes them."""
        out: list[tuple[str, str]] = []
        const = 0  # the offset so far (the sections before): const + its terms
        terms: dict[str, int] = {}
        for section in self.sections:
            if isinstance(section, Fixed):
                out += [(_render(const + k, terms), name) for k, name in enumerate(section.fields, 1)]
                const += len(section.fields)
            elif isinstance(section, Run):
                end = _plus(terms, section.count, 1)
                out.append((f"{_render(const + 1, terms)}..{_render(const, end)}", section.field))
                terms = end
            elif isinstance(section, Each):
                width = len(section.fields)
                row = _plus(terms, section.index, width)
                out += [(_render(const + k - width, row), name)
                        for k, name in enumerate(section.fields, 1)]
                terms = _plus(terms, section.count, width)
            else:
                out.append((f"{_render(const + 1, terms)}..", section.field))
        return out

    def split(self, values: Sequence[Any], counts: dict[str, int]) -> dict[str, list[Any]]:
        """``values`` (a call's keys or args) read back by field, given each count symbol's
        value: the inverse of a build, for tests. Raises ValueError when they do not fit."""
        out: dict[str, list[Any]] = {}
        at = 0

        def take(size: int) -> list[Any]:
            nonlocal at
            if at + size > len(values):
                raise ValueError(f"{len(values)} values: too few for this layout")
            at += size
            return list(values[at - size:at])

        for section in self.sections:
            if isinstance(section, Fixed):
                for name in section.fields:
                    out[name] = take(1)
            elif isinstance(section, Run):
                out[section.field] = take(counts[section.count])
            elif isinstance(section, Each):
                rows = take(counts[section.count] * len(section.fields))
                for k, name in enumerate(section.fields):
                    out[name] = rows[k::len(section.fields)]
            else:
                out[section.field] = take(len(values) - at)
        if at != len(values):
            raise ValueError(f"{len(values) - at} values left over after this layout")
        return out


@dataclass(frozen=True)
class Returns:
    """A script's reply: a Lua table of ``fields`` (``listed``) or one value so named.

    ``rest``: the last field takes every item left. ``rows``: the groups its fields are made
    of. ``codes``: the enum of the one-digit codes it returns (member n is digit n). ``asks``:
    it may answer ``{'?', key, ...}`` instead, having written nothing (``Scripts.run`` calls it
    again with those keys declared).
    """

    fields: tuple[str, ...]
    listed: bool = True
    rest: bool = False
    rows: tuple[Row, ...] = ()
    codes: type[enum.Enum] | None = None
    asks: bool = False

    @property
    def shape(self) -> str:
        """As the header's ``-- returns = <shape>`` line writes it: ``{now_ms, leases...}``."""
        names = _names(self.fields, self.rest)
        return "{" + names + "}" if self.listed else names


@dataclass(frozen=True)
class Contract:
    """What a script's header states, as its binding declares it."""

    script: str
    keys: Layout
    argv: Layout
    returns: Returns


class Binding:
    """Base of the typed bindings: one subclass per script, with ``build`` and ``parse``."""

    contract: ClassVar[Contract]

    @classmethod
    def call(cls, keys: Sequence[str], args: Sequence[ScriptArg]) -> ScriptCall:
        return ScriptCall(cls.contract.script, keys, args)
