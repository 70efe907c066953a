"""`--help` that states each option's default: the formatter every subcommand's parser may use.

argparse's own ArgumentDefaultsHelpFormatter also writes "(default: None)" under options that
have none; this one adds the default only where there is one and the help does not say it.
"""

from __future__ import annotations

import argparse
from typing import Any

_NONE: tuple[Any, ...] = (None, False, [], argparse.SUPPRESS)


class DefaultsHelp(argparse.HelpFormatter):
    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.option_strings and action.default not in _NONE and "default" not in text:
            text += " (default: %(default)s)"
        return text


class RawDefaultsHelp(DefaultsHelp, argparse.RawDescriptionHelpFormatter):
    """The same, with the description printed as written."""
