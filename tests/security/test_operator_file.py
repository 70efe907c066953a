"""The operator file's secrets: read once at load, from the environment or from a file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from proxy.operator import OperatorError, load_operator


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


def test_a_file_secret_is_read_relative_to_the_operator_file(tmp_path: Path) -> None:
    tmp_path.chmod(0o700)
    _write(tmp_path / "coder.key", "s3cret-from-file\n")
    op = load_operator(
        _write(tmp_path / "operator.yaml", "secrets:\n  coder-key: {file: coder.key}\n")
    )
    assert op.secret("coder-key") == "s3cret-from-file"


def test_an_env_secret_is_read_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp_path.chmod(0o700)
    monkeypatch.setenv("SPECROUTER_TEST_KEY", "s3cret-from-env")
    op = load_operator(
        _write(tmp_path / "operator.yaml", "secrets:\n  coder-key: {env: SPECROUTER_TEST_KEY}\n")
    )
    assert op.secret("coder-key") == "s3cret-from-env"


def test_a_missing_secret_file_is_refused_at_load(tmp_path: Path) -> None:
    tmp_path.chmod(0o700)
    path = _write(tmp_path / "operator.yaml", "secrets:\n  coder-key: {file: absent.key}\n")
    with pytest.raises(OperatorError, match="secrets.coder-key.file"):
        load_operator(path)
    assert not os.path.exists(tmp_path / "absent.key")
