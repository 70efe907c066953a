"""The operator file's secrets: read once at load, from the environment or from a file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from proxy.operator import OperatorError, load_operator
from proxy.safety import UnsafeSettings, check_startup
from proxy.settings import Settings, is_loopback


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


# -- who may change the file (docs/security-hardening.md) ------------------------------------------

OTHER_UID = 65534  # nobody


def _private(tmp_path: Path) -> Path:
    d = tmp_path / "private"
    d.mkdir(mode=0o700)
    return _write(d / "operator.yaml", "engine_hosts: [127.0.0.1]\n")


def _link_in(tmp_path: Path, mode: int) -> Path:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    link = shared / "operator.yaml"
    link.symlink_to(_private(tmp_path))
    return link


def _other_users(tmp_path: Path) -> Path:
    path = _private(tmp_path)
    path.chmod(0o644)
    os.chown(path, OTHER_UID, OTHER_UID)
    return path


def _others_link_in_sticky(tmp_path: Path) -> Path:
    link = _link_in(tmp_path, 0o1777)
    os.lchown(link, OTHER_UID, OTHER_UID)
    return link


def _through_dir_link_in(tmp_path: Path, mode: int) -> Path:
    """The file's directory reached through a symlink that sits in a `mode` directory."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    (shared / "dir").symlink_to(_private(tmp_path).parent)
    return shared / "dir" / "operator.yaml"


def _under(tmp_path: Path, mode: int) -> Path:
    """The file's own (private) directory inside a `mode` one."""
    parent = tmp_path / "parent"
    parent.mkdir()
    parent.chmod(mode)
    (parent / "private").mkdir(mode=0o700)
    return _write(parent / "private" / "operator.yaml", "engine_hosts: [127.0.0.1]\n")


def _in_others_dir(tmp_path: Path) -> Path:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    return _write(theirs / "operator.yaml", "engine_hosts: [127.0.0.1]\n")


def _relative_link(tmp_path: Path) -> Path:
    _private(tmp_path)
    (tmp_path / "links").mkdir(mode=0o700)
    link = tmp_path / "links" / "operator.yaml"
    link.symlink_to("../private/./operator.yaml")
    return link


# (case, the file as the gateway is given it, needs root to set up, refused with)
CASES = [
    ("own-file", _private, False, None),
    ("own-link-in-private-dir", lambda p: _link_in(p, 0o700), False, None),
    ("link-in-world-writable-dir", lambda p: _link_in(p, 0o777), False, "writable by others"),
    ("own-link-in-sticky-dir", lambda p: _link_in(p, 0o1777), False, None),
    ("others-link-in-sticky-dir", _others_link_in_sticky, True, "symlink owned by uid"),
    ("0644-owned-by-another-user", _other_users, True, "owned by uid"),
    # every directory on the way, from / down and through each symlink
    ("dir-link-in-world-writable-dir", lambda p: _through_dir_link_in(p, 0o777), False, "writable"),
    ("dir-link-in-private-dir", lambda p: _through_dir_link_in(p, 0o700), False, None),
    ("ancestor-world-writable", lambda p: _under(p, 0o777), False, "parent is writable by others"),
    ("ancestor-sticky", lambda p: _under(p, 0o1777), False, None),
    ("directory-owned-by-another-user", _in_others_dir, True, "theirs is owned by uid"),
    ("own-relative-link", _relative_link, False, None),
]


@pytest.mark.parametrize(("case", "make", "root", "refused"), CASES, ids=[c[0] for c in CASES])
def test_the_operator_file_is_refused_when_another_user_could_change_it(
    tmp_path: Path, case: str, make: Any, root: bool, refused: str | None
) -> None:
    if root and os.geteuid() != 0:
        pytest.skip("setting another user's ownership needs root")
    tmp_path.chmod(0o700)
    path = make(tmp_path)
    if refused is None:
        assert load_operator(path).context.engine_hosts == {"127.0.0.1"}
    else:
        with pytest.raises(OperatorError, match=refused):
            load_operator(path)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("127.0.0.1.nip.io", False),  # a name that resolves anywhere
        ("127.example.com", False),
        ("0.0.0.0", False),
        ("10.0.0.7", False),
    ],
)
def test_the_loopback_check_takes_addresses_not_names_that_look_like_them(
    host: str, loopback: bool
) -> None:
    assert is_loopback(host) is loopback
    settings = Settings(admin_token=["t" * 40], admin_listen=f"{host}:9443")
    if loopback:
        check_startup(settings)
    else:
        with pytest.raises(UnsafeSettings, match="off loopback"):
            check_startup(settings)
