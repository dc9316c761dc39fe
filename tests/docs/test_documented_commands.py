"""Every command the documentation shows is one that exists, with options that exist.

The shell blocks of the README and of every page under docs/ are read line by line: an ``ingest``
command must parse with the installed CLI (its subcommand, options and arguments, as click reads
them, without running it), ``make X`` must name a target of the Makefile, and ``python <file>`` or
``python -m <module>`` must name a script of the repository or an importable module. A renamed
option or a removed command then fails here instead of in a reader's terminal.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer

from ingest.cli.commands import app

try:  # typer carries its own copy of click; its commands raise that copy's errors
    from typer._click.exceptions import UsageError
except ImportError:  # a typer that uses the installed click
    from click.exceptions import UsageError  # type: ignore[assignment]

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"^```(?:bash|sh|shell|console)\n(.*?)^```", re.S | re.M)
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def documented_commands() -> list[tuple[str, list[str]]]:
    """``(page, words)`` for every command line of every shell block; comments and env assignments dropped."""
    found = []
    for page in PAGES:
        for block in BLOCK.findall(page.read_text()):
            for line in block.splitlines():
                line = re.split(r"\s#\s|\s#$|^#", line, maxsplit=1)[0].strip()
                if not line:
                    continue
                words = shlex.split(line)
                while words and ASSIGNMENT.match(words[0]):
                    words = words[1:]
                if words:
                    found.append((str(page.relative_to(ROOT)), words))
    return found


def _program(word: str) -> str:
    return word.rsplit("/", 1)[-1]


COMMANDS = [(page, words) for page, words in documented_commands()
            if _program(words[0]) in ("ingest", "make", "python", "python3")]


def _parse(words: list[str]) -> None:
    """Let click parse an ``ingest`` command line without running it; raise on any mistake."""
    command: Any = typer.main.get_command(app)  # a group of commands, or one command
    name = "ingest"
    args = list(words)
    while hasattr(command, "list_commands"):  # a group: the next word names its command
        if args == ["--help"] or (args == ["--version"] and name == "ingest"):
            return
        while args and args[0].startswith("-"):  # the group's own options (ingest --log-format json run)
            option = next((p for p in command.params if args[0] in p.opts), None)
            assert option is not None, f"{name} has no option {args[0]!r}"
            args = args[1 if option.is_flag else 2:]
        assert args and not args[0].startswith("-"), f"no subcommand of {name} in {words}"
        sub = command.get_command(command.context_class(command), args[0])
        assert sub is not None, f"{name} has no command {args[0]!r}"
        command, name, args = sub, f"{name} {args[0]}", args[1:]
    if "--help" not in args:  # click answers --help by printing and exiting
        command.make_context(name, args)


@pytest.mark.parametrize(("page", "words"), COMMANDS, ids=[f"{p}: {' '.join(w)[:60]}" for p, w in COMMANDS])
def test_a_documented_command_exists(page: str, words: list[str]) -> None:
    program = _program(words[0])
    if program == "ingest":
        _parse(words[1:])
    elif program == "make":
        targets = set(re.findall(r"^([A-Za-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))
        for target in [w for w in words[1:] if not ASSIGNMENT.match(w)]:
            assert target in targets, f"{page}: the Makefile has no target {target!r}"
    elif words[1:2] == ["-m"]:
        module = words[2]
        assert importlib.util.find_spec(module) is not None, f"{page}: no module {module}"
        if module == "pytest":
            paths = [w for w in words[3:] if not w.startswith("-") and "/" in w]
            assert all((ROOT / p.split("::")[0]).exists() for p in paths), f"{page}: {paths}"
    else:
        assert (ROOT / words[1]).is_file(), f"{page}: no script {words[1]}"


def test_the_documentation_shows_commands() -> None:
    programs = {_program(words[0]) for _, words in COMMANDS}
    assert {"ingest", "make", "python"} <= programs
    assert len(COMMANDS) > 50


def test_a_wrong_option_is_caught() -> None:
    with pytest.raises(UsageError):
        _parse(["run", "--no-such-option"])
    with pytest.raises(UsageError):
        _parse(["quarantine", "replay", "--no-recheck"])  # its --table is required
    with pytest.raises(UsageError):
        _parse(["history", "t", "--format", "xml"])  # not one of its formats
    with pytest.raises(AssertionError):
        _parse(["no-such-command"])
    _parse(["query", "-c", "configs/demo.yaml", "--as-of", "orders@3", "SELECT 1"])
