"""The `vllm serve` flags of one vLLM release, read from its source with `ast` (no vLLM install).

    python -m proxy.ops.deploy.flagtable SOURCE [--label TEXT] > proxy/ops/deploy/vllm_flags/X.Y.Z.txt

SOURCE is a vLLM wheel (`pip download vllm==X.Y.Z --no-deps`) or a source tree (the folder that
holds `vllm/`). Adding a release: run this on its wheel, commit the table it prints, add the
version to SUPPORTED in proxy/ops/deploy/versions.py and its features there.

Where the flags come from, as `vllm serve` builds its parser:
- `make_arg_parser` (found by following `vllm/entrypoints/cli/serve.py`'s import of it): its
  own `add_argument` calls, then `FrontendArgs.add_cli_args`, one `--field-name` per dataclass
  field of FrontendArgs and its bases;
- `EngineArgs.add_cli_args` and `AsyncEngineArgs.add_cli_args` in vllm/engine/arg_utils.py:
  every literal `--flag` of their `add_argument` calls.
A boolean field (`argparse.BooleanOptionalAction`, which vLLM's get_kwargs gives every `bool`
field) also has its `--no-` form. Only the flag names are kept: they are facts, not code.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import sys
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

SERVE_MODULE = "vllm/entrypoints/cli/serve.py"
ENGINE_MODULE = "vllm/engine/arg_utils.py"

Reader = Callable[[str], str | None]  # repository path -> text, None when absent


def source_reader(source: Path) -> tuple[Reader, str]:
    """A reader of `source` (a wheel or a tree), and what to name it by in the table's header."""
    if source.is_file():
        archive = zipfile.ZipFile(source)
        names = set(archive.namelist())
        digest = hashlib.sha256(source.read_bytes()).hexdigest()

        def from_wheel(path: str) -> str | None:
            return archive.read(path).decode() if path in names else None

        return from_wheel, f"{source.name} (sha256 {digest})"

    def from_tree(path: str) -> str | None:
        file = source / path
        return file.read_text() if file.is_file() else None

    return from_tree, str(source)


def _module_path(module: str, read: Reader) -> str | None:
    base = module.replace(".", "/")
    for path in (base + ".py", base + "/__init__.py"):
        if read(path) is not None:
            return path
    return None


def _defining_module(name: str, path: str, read: Reader, depth: int = 0) -> tuple[str, ast.Module]:
    """The module that defines `name`, following `from X import name` from `path`."""
    text = read(path)
    if text is None or depth > 8:
        raise LookupError(f"cannot find where {name} is defined (from {path})")
    tree = ast.parse(text)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name == name:
            return path, tree
    for found in ast.walk(tree):
        if (
            isinstance(found, ast.ImportFrom)
            and found.module
            and any(a.name == name for a in found.names)
        ):
            target = _module_path(found.module, read)
            if target is not None:
                return _defining_module(name, target, read, depth + 1)
    raise LookupError(f"{path} neither defines nor imports {name}")


def _class(tree: ast.Module, name: str) -> ast.ClassDef | None:
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _add_argument_calls(func: ast.AST) -> Iterator[tuple[ast.Call, list[str]]]:
    """Every `add_argument` call in `func`, with the literal `--flags` it names."""
    for node in ast.walk(func):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
        ):
            names = [
                a.value
                for a in node.args
                if isinstance(a, ast.Constant)
                and isinstance(a.value, str)
                and a.value.startswith("--")
            ]
            yield node, names


def _literal_flags(func: ast.AST) -> Iterator[str]:
    """The `--flags` of every `add_argument` call in `func`, with `--no-` for boolean ones."""
    for node, names in _add_argument_calls(func):
        yield from names
        if any(
            k.arg == "action" and ast.unparse(k.value).endswith("BooleanOptionalAction")
            for k in node.keywords
        ):
            yield from ("--no-" + n[2:] for n in names)


def _is_bool(annotation: ast.expr) -> bool:
    """vLLM's get_kwargs makes a `bool` field a BooleanOptionalAction, except `bool | str`."""
    names = {n.id for n in ast.walk(annotation) if isinstance(n, ast.Name)}
    return "bool" in names and "str" not in names


def _dataclass_flags(tree: ast.Module, name: str) -> Iterator[str]:
    """`--field-name` (and `--no-` for booleans) for each field of a class and its bases."""
    cls = _class(tree, name)
    if cls is None:
        raise LookupError(f"no class {name}")
    for base in cls.bases:
        if isinstance(base, ast.Name) and _class(tree, base.id) is not None:
            yield from _dataclass_flags(tree, base.id)
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if "ClassVar" in ast.unparse(node.annotation):
                continue
            flag = node.target.id.replace("_", "-")
            yield "--" + flag
            if _is_bool(node.annotation):
                yield "--no-" + flag


class _ConfigFields:
    """Field annotations of vLLM's config classes (for `**x_kwargs["field"]` arguments)."""

    def __init__(self, read: Reader, engine_tree: ast.Module) -> None:
        self.read = read
        self.imports: dict[str, str] = {}
        for node in ast.walk(engine_tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    self.imports[alias.asname or alias.name] = node.module

    def annotation(self, cls_name: str, field: str) -> ast.expr | None:
        module = self.imports.get(cls_name)
        if module is None:
            return None
        try:
            path = _module_path(module, self.read)
            if path is None:
                return None
            _, tree = _defining_module(cls_name, path, self.read)
        except LookupError:
            return None
        cls = _class(tree, cls_name)
        for node in cls.body if cls else ():
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and node.target.id == field
            ):
                return node.annotation
        return None


def _engine_flags(read: Reader) -> Iterator[str]:
    text = read(ENGINE_MODULE)
    if text is None:
        raise LookupError(f"no {ENGINE_MODULE}")
    tree = ast.parse(text)
    configs = _ConfigFields(read, tree)
    for cls_name in ("EngineArgs", "AsyncEngineArgs"):
        cls = _class(tree, cls_name)
        func = _method(cls, "add_cli_args") if cls else None
        if func is None:
            continue
        yield from _literal_flags(func)
        # x_kwargs = get_kwargs(SomeConfig); add_argument("--flag", **x_kwargs["field"])
        kwarg_sources: dict[str, str] = {}
        for node in ast.walk(func):
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Call)
                and ast.unparse(node.value.func) == "get_kwargs"
                and node.value.args
                and isinstance(node.value.args[0], ast.Name)
                and isinstance(node.targets[0], ast.Name)
            ):
                kwarg_sources[node.targets[0].id] = node.value.args[0].id
        for node, names in _add_argument_calls(func):
            # `**x_kwargs["field"]`, also when spread into a dict that overrides a default
            subs = [
                s
                for kw in node.keywords
                if kw.arg is None
                for s in ast.walk(kw.value)
                if isinstance(s, ast.Subscript)
                and isinstance(s.value, ast.Name)
                and s.value.id in kwarg_sources
                and isinstance(s.slice, ast.Constant)
            ]
            for sub in subs[:1]:
                assert isinstance(sub.value, ast.Name) and isinstance(sub.slice, ast.Constant)
                ann = configs.annotation(kwarg_sources[sub.value.id], str(sub.slice.value))
                if ann is not None and _is_bool(ann):
                    yield from ("--no-" + n[2:] for n in names)


def serve_flags(read: Reader) -> list[str]:
    """Every `--flag` `vllm serve` accepts in this release, sorted."""
    path, tree = _defining_module("make_arg_parser", SERVE_MODULE, read)
    make = next(
        n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "make_arg_parser"
    )
    flags = set(_literal_flags(make))
    for node in ast.walk(make):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_cli_args"
            and isinstance(node.func.value, ast.Name)
        ):
            owner = node.func.value.id
            if owner == "AsyncEngineArgs":
                flags |= set(_engine_flags(read))
            else:
                flags |= set(_dataclass_flags(tree, owner))
    return sorted(flags)


def release_of(read: Reader) -> tuple[str | None, str | None]:
    """(version, commit) from the `vllm/_version.py` a wheel carries."""
    text = read("vllm/_version.py")
    values: dict[str, str] = {}
    for node in ast.walk(ast.parse(text or "")):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and isinstance(node.value.value, str):
                    values[target.id] = node.value.value
    commit = values.get("commit_id")
    return values.get("version"), commit.removeprefix("g") if commit else None


def render_table(read: Reader, label: str) -> str:
    version, commit = release_of(read)
    engine = _defining_module("make_arg_parser", SERVE_MODULE, read)[0]
    lines = [
        f"# vLLM {version or '?'} `vllm serve` flags, one per line, sorted.",
        f"# From {label}" + (f", built from commit {commit}" if commit else "") + ".",
        f"# Read with `python -m proxy.ops.deploy.flagtable` from {engine} (make_arg_parser,",
        f"# FrontendArgs and its bases) and {ENGINE_MODULE} (EngineArgs/AsyncEngineArgs",
        "# .add_cli_args, with the config dataclasses' field types for the --no- forms).",
        *serve_flags(read),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m proxy.ops.deploy.flagtable",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("source", type=Path, help="a vLLM wheel, or a source tree holding vllm/")
    p.add_argument(
        "--label",
        help="how the header names the source (default: file name and "
        "sha256 of a wheel, the path of a tree)",
    )
    args = p.parse_args(argv)
    read, label = source_reader(args.source)
    sys.stdout.write(render_table(read, args.label or label))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
