"""The `specrouter` command explains itself: every option of every subcommand's parser (walked,
sub-subcommands included) has help text, and states its default when it has one;
`specrouter --version` is the installed package's."""

from __future__ import annotations

import argparse
import subprocess
import sys
from importlib import metadata

import pytest

from proxy import cli
from proxy.helptext import has_default
from proxy.settings import Settings

# Subcommands that choose a parser by their first word themselves, not through argparse.
_WORDS = {"probe": [["run"], ["compare"], ["facts"], ["pair"]]}


class _Parsed(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__(parser.prog)
        self.parser = parser


def _walk(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                found += _walk(sub)
    return found


@pytest.fixture(scope="module")
def parsers() -> list[argparse.ArgumentParser]:
    """Each subcommand's parser, as its `main` builds it (stopped where it would parse)."""

    def caught(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        raise _Parsed(self)

    found: list[argparse.ArgumentParser] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(argparse.ArgumentParser, "parse_known_args", caught)
        for name in cli.SUBCOMMANDS:
            for words in _WORDS.get(name, [[]]):
                with pytest.raises(_Parsed) as parsed:
                    cli.main([name, *words])
                found += _walk(parsed.value.parser)
    return found


def test_every_subcommand_is_walked(parsers: list[argparse.ArgumentParser]) -> None:
    progs = {p.prog for p in parsers}
    assert {"specrouter serve", "specrouter deploy render", "specrouter policy explain"} <= progs
    assert len(parsers) >= len(cli.SUBCOMMANDS) + 6  # deploy's, policy's, probe's own


def test_every_option_has_help_and_its_default(parsers: list[argparse.ArgumentParser]) -> None:
    missing, no_default = [], []
    for parser in parsers:
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            name = f"{parser.prog} {'/'.join(action.option_strings) or action.dest}"
            if not action.help or action.help == argparse.SUPPRESS:
                missing.append(name)
                continue
            said = parser._get_formatter()._get_help_string(action) or ""  # as --help shows it
            if action.option_strings and has_default(action):
                if "default" not in said.lower():
                    no_default.append(f"{name} (default {action.default!r})")
    assert not missing, "options without help text:\n" + "\n".join(missing)
    assert not no_default, "options whose help does not say the default:\n" + "\n".join(no_default)


def test_serve_says_each_settings_default(parsers: list[argparse.ArgumentParser]) -> None:
    """`serve`'s options default to None (unset: the settings decide): their help says the
    settings' default, timeouts included."""
    (serve,) = [p for p in parsers if p.prog == "specrouter serve"]
    silent = [
        "/".join(a.option_strings)
        for a in serve._actions
        if a.dest in Settings.model_fields
        and Settings.model_fields[a.dest].default not in (None, False, [])
        and "default" not in (a.help or "")
    ]
    assert not silent, f"serve options whose help does not say the default: {silent}"


def test_version() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "--version"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"specrouter {metadata.version('specrouter')}\n"
