"""`specrouter connect`'s writers, one per format: what they refuse, and what they quote so that
the format's own reader gives the value back unchanged."""

from __future__ import annotations

import json
import shlex
import subprocess
import tomllib

import pytest
import yaml

from proxy.ops.connect.quoting import (
    UnsafeValue,
    json_text,
    plain,
    shell_env,
    shell_words,
    shown,
    toml_text,
    yaml_text,
)

UNSAFE = ["a\nb", "a\rb", "a\x1b[2Jb", "a\x00b", "a\tb", "a\x7fb", "a\x85b", "a\u2028b"]
AWKWARD = ["it's", 'say "hi"', "back\\slash", "$HOME `id` $(id)", "a;b&&c|d", "#x", "ünï 模型"]


@pytest.mark.parametrize("value", UNSAFE)
def test_every_writer_refuses_a_control_character(value: str) -> None:
    for write in (
        lambda: plain("v", value),
        lambda: shell_words(["echo", value]),
        lambda: shell_env([], {"V": value}),
        lambda: shell_env([value], {}),
        lambda: toml_text({"model": value}),
        lambda: json_text({"env": {"M": value}}),
        lambda: yaml_text({"models": [value]}),
        lambda: json_text({value: "key"}),
    ):
        with pytest.raises(UnsafeValue):
            write()


def test_what_is_shown_has_its_control_characters_escaped() -> None:
    assert shown("m\x1b]0;x\x07\n") == "m\\x1b]0;x\\x07\\n"
    assert shown("x" * 300).endswith("...") and len(shown("x" * 300)) == 203


@pytest.mark.parametrize("value", AWKWARD)
def test_each_format_reads_back_the_value_written(value: str) -> None:
    assert tomllib.loads(toml_text({"model": value}))["model"] == value
    assert json.loads(json_text({"model": value}))["model"] == value
    assert yaml.safe_load(yaml_text({"model": value}))["model"] == value
    assert shlex.split(shell_words(["echo", value])) == ["echo", value]
    script = shell_env(["a comment"], {"V": value}) + 'printf %s "$V"'
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=10)
    assert done.stdout == value


def test_a_variable_name_is_checked() -> None:
    with pytest.raises(UnsafeValue, match="not a variable name"):
        shell_env([], {"A=1; id #": "x"})
