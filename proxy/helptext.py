"""`--help` that states each option's default: the formatter every subcommand's parser may use.

argparse's own ArgumentDefaultsHelpFormatter also writes "(default: None)" under options that
have none; this one adds the default only where there is one and the help does not say it.
"""

from __future__ import annotations

import argparse
from typing import Any


def has_default(action: argparse.Action) -> bool:
    """A default worth saying: not None, False (a flag), [] (a repeatable option) or SUPPRESS;
    by identity, so 0 is a default."""
    value: Any = action.default
    return not (value is None or value is False or value == [] or value is argparse.SUPPRESS)


class DefaultsHelp(argparse.HelpFormatter):
    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.option_strings and has_default(action) and "default" not in text:
            text += " (default: %(default)s)"
        return text
