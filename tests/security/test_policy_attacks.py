"""Attacks found on loopback, replayed: whoever may change the policy (admin API or file) must
not reach anything else on the host, and weak deployments must not start.

Each attack is a policy PUT; the answer is a 422 naming the field, and nothing changed: the
policy version, no command ran (its marker file never appears), no secret left (a loopback
listener records what it receives), and another client is still served.
"""

from __future__ import annotations

import copy
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from loadtests.harness.gateway import ADMIN_TOKEN, GatewayServer, coder_policy
from loadtests.harness.ports import free_port
from loadtests.harness.sim import SimServer
from proxy.safety import UnsafeSettings, check_startup
from proxy.settings import Settings

SECRET = "sk-gateway-secret-never-sent"
AUTH = {"authorization": f"Bearer {ADMIN_TOKEN}"}


class Recorder:
    """A loopback listener that keeps every byte it receives and answers nothing useful."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.received = bytearray()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(0.5)
                try:
                    while chunk := conn.recv(65536):
                        self.received += chunk
                except OSError:
                    pass


@pytest.fixture(scope="module")
def stack(certs, tmp_path_factory) -> Iterator[tuple[GatewayServer, Recorder, Path]]:
    marker_dir = tmp_path_factory.mktemp("markers")
    recorder = Recorder()
    os.environ["SOME_SECRET"] = SECRET  # inherited by the gateway: what the attack reads
    try:
        with SimServer("mtp3", served_model_name="qwen3.8-27b", time_scale=0.02) as sim:
            policy = coder_policy({"a": sim.url})
            # A backend that is down, with a repair the operator defined: the attack replaces it.
            policy["backends"]["down"] = {
                "url": f"http://127.0.0.1:{free_port()}",
                "served_model_name": "qwen3.8-27b",
                "startup_s": 0,
                "repair": {"action": "noop", "after_down_s": 0},
            }
            policy["routes"]["down"] = {"models": ["down"], "variants": ["down"]}
            policy["health"] = {"fail_after": 1, "recover_after": 1}
            operator = {
                "actions": {"noop": {"command": ["true"]}},
                "secrets": {"coder-key": {"env": "SOME_SECRET"}},
            }
            with GatewayServer(policy, certs=certs, operator=operator) as gw:
                yield gw, recorder, marker_dir
    finally:
        os.environ.pop("SOME_SECRET", None)
        recorder.sock.close()


def _repair_command(policy: dict[str, Any], marker: Path) -> None:
    policy["backends"]["down"]["repair"] = {
        "command": ["/bin/sh", "-c", f"touch {marker}"],
        "after_down_s": 0,
    }


def _undefined_action(policy: dict[str, Any], marker: Path) -> None:
    policy["backends"]["down"]["repair"] = {"action": "wipe-disk", "after_down_s": 0}


def _env_secret(policy: dict[str, Any], port: int) -> None:
    policy["backends"]["a"].update(url=f"http://127.0.0.1:{port}", api_key_env="SOME_SECRET")


def _undefined_secret(policy: dict[str, Any], port: int) -> None:
    policy["backends"]["a"].update(url=f"http://127.0.0.1:{port}", api_key="other-key")


def _url(url: str) -> Any:
    def change(policy: dict[str, Any], port: int) -> None:
        policy["backends"]["a"]["url"] = url.format(port=port)

    return change


# (attack, change to the current policy, field the 422 must name)
COMMAND_ATTACKS = [
    ("repair-command", _repair_command, "backends.down.repair"),
    ("repair-undefined-action", _undefined_action, "backends.down.repair.action"),
]
SECRET_ATTACKS = [
    ("api-key-env", _env_secret, "backends.a"),
    ("api-key-undefined-secret", _undefined_secret, "backends.a.api_key"),
    ("url-userinfo", _url("http://user:pass@127.0.0.1:{port}"), "backends.a.url"),
    ("url-metadata-host", _url("http://169.254.169.254"), "backends.a.url"),
    ("url-private-range", _url("http://10.0.0.1:{port}"), "backends.a.url"),
    ("url-other-host", _url("http://attacker.example:{port}"), "backends.a.url"),
    ("url-query", _url("http://127.0.0.1:{port}/x?"), "backends.a.url"),
    ("url-fragment", _url("http://127.0.0.1:{port}#"), "backends.a.url"),
    ("url-scheme", _url("file://127.0.0.1/etc/passwd"), "backends.a.url"),
]


def _attempt(gw: GatewayServer, change: Any, arg: Any, field: str) -> httpx.Response:
    current = httpx.get(gw.admin + "/admin/policy", headers=AUTH, timeout=10)
    version = current.json()["version"]
    doc = copy.deepcopy(current.json()["document"])
    change(doc, arg)
    r = httpx.put(
        gw.admin + "/admin/policy",
        headers={**AUTH, "if-match": f'"{version}"'},
        content=yaml.safe_dump(doc).encode(),
        timeout=10,
    )
    assert r.status_code == 422, r.text
    assert field in r.text, r.text
    after = httpx.get(gw.admin + "/admin/policy", headers=AUTH, timeout=10).json()["version"]
    assert after == version  # nothing applied
    return r


def _other_client_served(gw: GatewayServer) -> None:
    with gw.client() as c:
        r = c.post(
            "/v1/chat/completions",
            json={
                "model": "coder",
                "max_tokens": 2,
                "messages": [{"role": "user", "content": "hi"}],
            },
        )
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("name", "change", "field"), COMMAND_ATTACKS, ids=[a[0] for a in COMMAND_ATTACKS]
)
def test_policy_cannot_run_a_command(stack, name, change, field) -> None:
    gw, _, markers = stack
    marker = markers / name
    _attempt(gw, change, marker, field)
    time.sleep(1.5)  # the down backend's repair would have run by now (health every 0.25 s)
    assert not marker.exists()
    _other_client_served(gw)


@pytest.mark.parametrize(
    ("name", "change", "field"), SECRET_ATTACKS, ids=[a[0] for a in SECRET_ATTACKS]
)
def test_policy_cannot_send_a_secret_or_reach_another_host(stack, name, change, field) -> None:
    gw, recorder, _ = stack
    _attempt(gw, change, recorder.port, field)
    _other_client_served(gw)
    assert SECRET.encode() not in recorder.received
    assert recorder.received == b""  # the gateway never sent the listener anything


def test_errors_name_the_backend_not_its_address(stack) -> None:
    gw, _, _ = stack
    port = yaml.safe_load(gw.policy_path.read_text())["backends"]["down"]["url"].rsplit(":")[-1]
    with gw.client() as c:
        for stream in (False, True):
            r = c.post(
                "/v1/chat/completions",
                json={
                    "model": "down",
                    "max_tokens": 2,
                    "stream": stream,
                    "messages": [{"role": "user", "content": "hi"}],
                },
            )
            assert r.status_code in (502, 503), r.text
            if r.status_code == 502:
                assert "backend 'down'" in r.text
            assert port not in r.text and "127.0.0.1" not in r.text
    assert SECRET not in "".join(gw.output)


# -- startup refusals --------------------------------------------------------------------------


def _serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(coder_policy({"a": "http://127.0.0.1:9"})))
    cmd = [
        sys.executable,
        "-m",
        "proxy.cli",
        "serve",
        "--config",
        str(policy),
        "--listen",
        "127.0.0.1:0",
        "--insecure-http",
        "--state-dir",
        str(tmp_path / "s"),
        *args,
    ]
    return subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )


def _writable_operator(tmp_path: Path) -> str:
    path = tmp_path / "operator.yaml"
    path.write_text("actions: {}\n")
    path.chmod(0o666)
    return str(path)


LONG = "x" * 40
REFUSED = [
    ("short-token", ["--admin-token", "short-token"], "characters"),
    ("default-token", ["--admin-token", "change-me"], "characters"),
    (
        "admin-off-loopback",
        ["--admin-token", LONG, "--admin-listen", "0.0.0.0:0"],
        "off loopback without TLS",
    ),
    (
        "metrics-off-loopback",
        ["--admin-token", LONG, "--metrics-listen", "0.0.0.0:0"],
        "loopback only",
    ),
]


@pytest.mark.parametrize(("name", "args", "message"), REFUSED, ids=[r[0] for r in REFUSED])
def test_unsafe_settings_refuse_to_start(tmp_path, name, args, message) -> None:
    out = _serve(tmp_path, "--admin-listen", "127.0.0.1:0", *args)
    assert out.returncode == 2 and message in out.stderr, out.stderr


def test_writable_operator_file_refuses_to_start(tmp_path) -> None:
    out = _serve(
        tmp_path,
        "--admin-token",
        LONG,
        "--admin-listen",
        "127.0.0.1:0",
        "--operator-file",
        _writable_operator(tmp_path),
    )
    assert out.returncode == 2 and "writable by others" in out.stderr, out.stderr


def test_a_token_printed_in_a_shipped_file_is_refused(tmp_path) -> None:
    token = "published-example-token-0123456789abcdef"
    (tmp_path / "deploy").mkdir()
    (tmp_path / "deploy" / "env.example").write_text(f"SPECROUTER_ADMIN_TOKEN={token}\n")
    with pytest.raises(UnsafeSettings, match="published default"):
        check_startup(Settings(admin_token=token), shipped_root=tmp_path)
    check_startup(Settings(admin_token="a-token-of-our-own-" + "z" * 20), shipped_root=tmp_path)


def test_no_shipped_file_holds_a_usable_admin_token() -> None:
    """Every admin token a shipped file sets is empty (to fill in) or required at deploy time."""
    root = Path(__file__).resolve().parents[2] / "deploy"
    env_line = re.compile(r"^\s*(?:export\s+)?\w*ADMIN_TOKEN=(.*)$", re.M)
    yaml_value = re.compile(r"\w*ADMIN_TOKEN:\s*(\S.*)$", re.M)
    checked = 0
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix != ".json"):
        text = path.read_text(errors="replace")
        for value in env_line.findall(text):
            checked += 1
            assert value.strip() == "", f"{path}: a default admin token {value!r}"
        for value in yaml_value.findall(text):
            checked += 1
            assert value.startswith("${") and ":?" in value, f"{path}: admin token {value!r}"
    assert checked >= 3  # env.example, the systemd env, compose


def test_shipped_policies_validate_against_their_operator_files(tmp_path: Path) -> None:
    from policies.schema import parse_policy
    from proxy.operator import Operator, OperatorSpec
    from proxy.ops.demo import DEMO_POLICY, write_demo_operator
    from proxy.ops.deploy import render_operator

    repo = Path(__file__).resolve().parents[2]
    configmap = next(
        d for d in yaml.safe_load_all((repo / "deploy/k8s/configmap.yaml").read_text()) if d
    )
    pairs = [
        (configmap["data"]["policy.yaml"], configmap["data"]["operator.yaml"]),
        ((repo / "policies/gb10.yaml").read_text(), (repo / "deploy/operator.yaml").read_text()),
        (DEMO_POLICY.read_text(), write_demo_operator(DEMO_POLICY, tmp_path).read_text()),
        ((repo / "policies/demo-three.yaml").read_text(), "{}"),
    ]
    for path in ("loadtests/bench/sweep/gb10-three.yaml", "policies/gb10-pair.yaml"):
        text = (repo / path).read_text()
        pairs.append((text, render_operator(parse_policy(text))))
    for policy, operator in pairs:
        spec = OperatorSpec.model_validate(yaml.safe_load(operator) or {})
        parse_policy(policy, Operator(spec).context)
