"""What the README and docs/ name exists in the code: every ``EOGUARD_*`` variable is read
somewhere, every command line they show (``eoguard ...`` from the click tree of the package's
console scripts, ``python -m eoguard_spark ...`` from its argparse parser) names commands and
flags that exist, and docs/design.md's layer list is the one test_layers.py enforces. The CLI
is read from the code, never listed here."""

from __future__ import annotations

import ast
import fnmatch
import importlib
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
import tomllib

from eoguard_spark.__main__ import parser as spark_parser
from tests.unit.test_layers import LAYERS

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
         ROOT / "connectors" / "spark" / "README.md"]
CODE = [ROOT / "eoguard", ROOT / "connectors" / "spark" / "eoguard_spark", ROOT / "bench",
        ROOT / "tests"]
THIS = Path(__file__).resolve()

VARIABLE = re.compile(r"(?<![A-Za-z0-9_])EOGUARD_[A-Z0-9_*]*[A-Z0-9*]")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
PROMPT = re.compile(r"^(?:\$ )?(?:\.venv/bin/)?")


# -- environment variables --------------------------------------------------------------

def doc_variables(text: str) -> set[str]:
    """``EOGUARD_*`` names in a page; ``*`` stands for any part (``EOGUARD_CLUSTER_*_PORT``)."""
    return {name.rstrip("_") for name in VARIABLE.findall(text)}


def _strings(tree: ast.AST) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value


def _fstring_tails(tree: ast.AST) -> Iterator[str]:
    """The constant after a placeholder that opens an f-string: ``f"{prefix}KAFKA_PORT"``."""
    for node in ast.walk(tree):
        if (isinstance(node, ast.JoinedStr) and len(node.values) == 2
                and isinstance(node.values[0], ast.FormattedValue)
                and isinstance(node.values[1], ast.Constant)):
            yield str(node.values[1].value)


def code_variables(files: list[Path]) -> set[str]:
    """The names the code reads: a string that is exactly ``EOGUARD_X`` (an ``os.environ`` key,
    a click ``envvar``, a constant), or a prefix string ``EOGUARD_..._`` joined in an f-string
    with a tail (``f"{self.env}KAFKA_PORT"``). Docstrings and messages never match whole."""
    names: set[str] = set()
    prefixes: set[str] = set()
    tails: set[str] = set()
    for file in files:
        tree = ast.parse(file.read_text(), str(file))
        for value in _strings(tree):
            if re.fullmatch(r"EOGUARD_[A-Z0-9_]*[A-Z0-9]", value):
                names.add(value)
            elif re.fullmatch(r"EOGUARD_(?:[A-Z0-9]+_)*", value):
                prefixes.add(value)
        tails.update(t for t in _fstring_tails(tree) if re.fullmatch(r"[A-Z0-9_]+", t))
    return names | {prefix + tail for prefix in prefixes for tail in tails}


def unread(doc_names: set[str], read: set[str]) -> list[str]:
    return sorted(name for name in doc_names
                  if not any(fnmatch.fnmatchcase(r, name) or r.startswith(name + "_") for r in read))


def code_files() -> list[Path]:
    return [f for d in CODE for f in sorted(d.rglob("*.py")) if f.resolve() != THIS]


@pytest.fixture(scope="module")
def read_variables() -> set[str]:
    return code_variables(code_files())


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_variable_a_page_names_is_read_by_the_code(page: Path, read_variables: set[str]
                                                         ) -> None:
    assert unread(doc_variables(page.read_text()), read_variables) == []


def test_the_variable_check_can_fail(read_variables: set[str]) -> None:
    page = "export EOGUARD_KAFKA_BOOTSTRAP=x EOGUARD_KAFKA_BOOTSTRAPS=y; `EOGUARD_CLUSTER_*_PORT`"
    assert unread(doc_variables(page), read_variables) == ["EOGUARD_KAFKA_BOOTSTRAPS"]
    # the f-string composition is what finds the cluster ports: they are read, not listed
    assert "EOGUARD_CLUSTER_REDIS_PORT" in read_variables


# -- command lines ----------------------------------------------------------------------

def snippets(text: str) -> Iterator[str]:
    """Command lines of a page: each line of a fenced block (``\\`` continuations joined,
    comments dropped) and each inline code span, with ``$ `` and ``.venv/bin/`` stripped."""
    for block in FENCE.findall(text):
        for raw in block.replace("\\\n", " ").splitlines():
            line = PROMPT.sub("", raw.strip())
            yield line.split("  #")[0].split(" # ")[0].strip()
    for span in INLINE.findall(FENCE.sub("", text)):
        yield PROMPT.sub("", span.strip())


def words(line: str) -> list[str]:
    """The words of a usage line: ``[...]`` and ``...`` dropped, ``\\|`` as ``|``."""
    line = re.sub(r"\.\.\.|…|[\[\]]", "", line.replace("\\|", "|"))
    try:
        return shlex.split(line)
    except ValueError:  # an unbalanced quote: a usage line, not a shell line
        return line.split()


def console_scripts() -> dict[str, click.Command]:
    """The root click command of each console script in pyproject.toml."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    roots: dict[str, click.Command] = {}
    for name, target in scripts.items():
        module_name, _, attr = target.partition(":")
        module = importlib.import_module(module_name)
        obj = getattr(module, attr)
        if isinstance(obj, click.Command):
            roots[name] = obj
            continue
        found = {id(v): v for v in vars(module).values() if isinstance(v, click.Group)}
        assert len(found) == 1, f"{target}: expected one click group beside it, found {len(found)}"
        roots[name] = next(iter(found.values()))
    return roots


def _takes_value(commands: list[click.Command], flag: str) -> bool | None:
    """Whether ``flag`` takes a value on one of ``commands``; None when none has it."""
    for command in commands:
        for param in command.params:
            if isinstance(param, click.Option) and flag in (*param.opts, *param.secondary_opts):
                return not (param.is_flag or param.count)
        if flag in command.get_help_option_names(click.Context(command)):
            return False
    return None


def check_click(root: click.Command, name: str, args: list[str]) -> list[str]:
    """What in ``name args`` the click tree does not have. A usage line's alternatives
    (``up|down [--clean]|status``, ``--spark/--no-spark``) are each checked: a flag against
    the commands reached so far, a word against their group."""
    problems: list[str] = []
    group: click.Command = root
    parent: click.Group = root if isinstance(root, click.Group) else click.Group()
    commands: list[click.Command] = [root]
    path, i = name, 0
    while i < len(args):
        word = args[i]
        i += 1
        if re.fullmatch(r"-\d+", word) or not (word.startswith("-")
                                                or isinstance(group, click.Group)):
            continue  # an argument of a leaf command
        reached: list[click.Command] = []
        for part in word.split("|"):
            if part.startswith("-"):
                for flag in part.split("=")[0].split("/"):
                    takes = _takes_value(commands, flag)
                    if takes is None:
                        problems.append(f"{path}: no option {flag}")
                    elif takes and part == word and "=" not in word:
                        i += 1  # its value
            else:  # a command of the group, or (``[--clean]|status``) of the leaves' group
                home = group if isinstance(group, click.Group) else parent
                if part not in home.commands:
                    problems.append(f"{path}: no command {part}")
                    return problems
                reached.append(home.commands[part])
        if reached:
            commands = reached
            path = f"{path} {'|'.join(c.name or '' for c in reached)}"
            if len(reached) == 1 and isinstance(reached[0], click.Group):
                group = parent = reached[0]
            elif not any(isinstance(c, click.Group) for c in reached):
                group = reached[0]  # leaves: the words that follow are their arguments
    return problems


def check_spark(args: list[str]) -> list[str]:
    known = spark_parser()._option_string_actions
    return [f"python -m eoguard_spark: no option {w.split('=')[0]}" for w in args
            if w.startswith("--") and w.split("=")[0] not in known]


def check_line(line: str, roots: dict[str, click.Command]) -> list[str]:
    found = words(line)
    if found[:3] == ["python", "-m", "eoguard_spark"]:
        return check_spark(found[3:])
    if found and found[0] in roots:
        return check_click(roots[found[0]], found[0], found[1:])
    return []


def command_lines(text: str, roots: dict[str, click.Command]) -> list[str]:
    return [line for line in snippets(text)
            if line.split(" ")[0] in roots or line.startswith("python -m eoguard_spark ")]


@pytest.fixture(scope="module")
def roots() -> dict[str, click.Command]:
    return console_scripts()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_line_a_page_shows_exists(page: Path, roots: dict[str, click.Command]
                                                ) -> None:
    text = page.read_text()
    assert [p for line in command_lines(text, roots) for p in check_line(line, roots)] == []


def test_the_pages_show_command_lines(roots: dict[str, click.Command]) -> None:
    shown = [line for page in PAGES for line in command_lines(page.read_text(), roots)]
    assert any(line.startswith("eoguard outbox list") for line in shown)
    assert any(line.startswith("python -m eoguard_spark --bootstrap") for line in shown)


def test_the_command_check_can_fail(roots: dict[str, click.Command]) -> None:
    page = ("```sh\neoguard outbox list --state pending --colour red\n"
            "eoguard outbox lst\n.venv/bin/python -m eoguard_spark --bootstrap b \\\n"
            "    --topics t  # --no-such-flag in a comment is not checked\n```\n"
            "and `eoguard --prefix demo-1 status --json`, `eoguard --prefx status`,\n"
            "`eoguard-dev stack up|down [--clean]|stats`, `eoguard-dev demo --spark/--no-spork`,\n"
            "`eoguard stack up` (a command of eoguard-dev only).\n")
    problems = [p for line in command_lines(page, roots) for p in check_line(line, roots)]
    assert problems == ["eoguard outbox list: no option --colour", "eoguard outbox: no command lst",
                        "python -m eoguard_spark: no option --topics",
                        "eoguard: no option --prefx", "eoguard-dev stack up|down: no command stats",
                        "eoguard-dev demo: no option --no-spork", "eoguard: no command stack"]


# -- the layer list -----------------------------------------------------------------------

def design_layers(text: str) -> set[str]:
    """The modules docs/design.md's "Imports follow the data" list names (up to the test)."""
    start = text.index("Imports follow the data")
    paragraph = text[start:text.index("`tests/", start)]
    return {name for name in re.findall(r"`([\w.]+)`", paragraph) if "." not in name}


def test_the_design_names_every_layer() -> None:
    layers = {name for names in LAYERS for name in names}
    assert design_layers((ROOT / "docs" / "design.md").read_text()) == layers


def test_the_layer_check_can_fail() -> None:
    text = "Imports follow the data: `errors`, `envelope` and `codec`. `tests/x.py`; `cli`.\n"
    assert design_layers(text) == {"errors", "envelope", "codec"}
