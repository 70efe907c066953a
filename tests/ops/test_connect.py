"""`specrouter connect` without a gateway: what it prints and writes, merged into a user's own
Codex config.toml (comments and other tables kept), backups, modes, and where its defaults come
from (flags, SPECROUTER_* variables, the demo's state directory). The agents themselves run
against the demo with these files in tests/agents/test_connect.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from proxy.certs import make_local_ca
from proxy.ops.connect.files import merge_toml
from proxy.ops.connect.gateway import record_demo_endpoint

ROOT = Path(__file__).resolve().parents[2]

USER_CONFIG = """\
# my Codex settings
model = "gpt-5"  # my default
model_reasoning_effort = "high"

[model_providers.other]
name = "other"
base_url = "https://other.example/v1"

[profiles.specrouter]
model = "stale"

[shell_environment_policy]
inherit = "all"
"""


def connect(home: Path, *args: str, env: dict[str, str] | None = None) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SPECROUTER_", "CODEX_"))}
    clean.pop("XDG_CONFIG_HOME", None)
    done = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "connect", *args],
        cwd=ROOT,
        env={**clean, "HOME": str(home), **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def demo_state(tmp_path: Path) -> Path:
    """A demo state directory as `specrouter demo` leaves it (no gateway running)."""
    state = tmp_path / "state"
    make_local_ca(state / "tls")
    (state / "client.key").write_text("sk-demo-test\n")
    record_demo_endpoint(state, "https://127.0.0.1:18443/v1", "qwen3.8-27b")
    return state


def test_merge_keeps_the_users_config_and_drops_only_our_legacy_profile() -> None:
    provider = {"name": "specrouter", "base_url": "https://h/v1", "env_key": "K"}
    merged = merge_toml(
        USER_CONFIG,
        ("model_providers", "specrouter"),
        provider,
        unset=(("profiles", "specrouter"),),
        unset_equal=(("profile", "specrouter"),),
    )
    assert "# my Codex settings\n" in merged and '"gpt-5"  # my default' in merged
    doc = tomllib.loads(merged)
    assert doc["model"] == "gpt-5" and doc["model_reasoning_effort"] == "high"
    assert doc["model_providers"]["other"]["base_url"] == "https://other.example/v1"
    assert doc["model_providers"]["specrouter"] == provider
    assert "profiles" not in doc  # Codex refuses `-p specrouter` beside it
    assert doc["shell_environment_policy"] == {"inherit": "all"}
    # Merging again changes nothing; a changed URL replaces our table, and only it.
    assert merge_toml(merged, ("model_providers", "specrouter"), provider) == merged
    moved = merge_toml(merged, ("model_providers", "specrouter"), {**provider, "base_url": "x"})
    assert tomllib.loads(moved)["model_providers"]["specrouter"]["base_url"] == "x"
    assert moved.replace('"x"', '"https://h/v1"') == merged
    # An empty file gets the table alone; a selector naming another profile stays.
    assert tomllib.loads(merge_toml("", ("p", "n"), {"a": "b"})) == {"p": {"n": {"a": "b"}}}
    kept = merge_toml('profile = "work"\n', ("p", "n"), {}, unset_equal=(("profile", "n"),))
    assert tomllib.loads(kept)["profile"] == "work"


def test_codex_write_merges_backs_up_and_reruns_unchanged(tmp_path: Path, demo_state: Path) -> None:
    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True)
    config = home / ".codex" / "config.toml"
    config.write_text(USER_CONFIG)
    out = connect(home, "codex", "--state-dir", str(demo_state), "--no-check", "--write")
    backups = list(config.parent.glob("config.toml.bak-*"))
    assert len(backups) == 1 and backups[0].read_text() == USER_CONFIG, out
    doc = tomllib.loads(config.read_text())
    assert doc["model_providers"]["specrouter"] == {
        "name": "specrouter",
        "base_url": "https://127.0.0.1:18443/v1",  # the demo's, from its state directory
        "env_key": "SPECROUTER_KEY",
        "wire_api": "responses",
        "supports_websockets": False,
    }
    assert doc["model"] == "gpt-5" and "other" in doc["model_providers"]
    # Codex refuses `exec` outside a git repository without this flag: the command says it.
    assert f"source {home}/.config/specrouter/codex.env && codex exec --skip-git-repo-check" in out
    profile = tomllib.loads((home / ".codex" / "specrouter.config.toml").read_text())
    assert profile == {"model": "qwen3.8-27b", "model_provider": "specrouter"}
    env = home / ".config" / "specrouter" / "codex.env"
    assert env.stat().st_mode & 0o777 == 0o600  # it holds the key
    text = env.read_text()
    assert "export SPECROUTER_KEY=sk-demo-test\n" in text
    bundle = home / ".config" / "specrouter" / "ca-bundle.pem"
    assert f"export SSL_CERT_FILE={bundle}\n" in text
    ca = (demo_state / "tls" / "ca.pem").read_text()
    assert bundle.read_text().endswith(ca) and bundle.read_text().count("BEGIN CERTIFICATE") > 1
    # Again: nothing changes, so nothing is written and no second backup appears.
    again = connect(home, "codex", "--state-dir", str(demo_state), "--no-check", "--write")
    assert again.count("unchanged") == 4 and "wrote" not in again
    assert len(list(config.parent.glob("config.toml.bak-*"))) == 1


def test_print_shows_what_write_would_write_and_writes_nothing(
    tmp_path: Path, demo_state: Path
) -> None:
    home = tmp_path / "home"
    out = connect(home, "claude-code", "--state-dir", str(demo_state), "--no-check")
    assert not home.exists()
    settings = out.split("claude-code.settings.json\n", 1)[1].split("\n# ", 1)[0]
    env = json.loads(settings)["env"]
    assert env["ANTHROPIC_BASE_URL"] == "https://127.0.0.1:18443"  # no /v1
    assert env["CLAUDE_CODE_GATEWAY_HINT_HEADERS"] == "1"
    assert env["ANTHROPIC_MODEL"] == env["ANTHROPIC_DEFAULT_HAIKU_MODEL"] == "qwen3.8-27b"
    assert f"export NODE_EXTRA_CA_CERTS={(demo_state / 'tls' / 'ca.pem').resolve()}" in out
    assert "claude --settings " in out


def test_a_deployed_gateway_from_flags_and_variables(tmp_path: Path, demo_state: Path) -> None:
    """--url never borrows the demo's CA or key; without --ca no CA setting is written."""
    home = tmp_path / "home"
    args = ("--url", "https://gw.example:8443", "--model", "coder", "--no-check")
    out = connect(
        home, "openai", "--state-dir", str(demo_state), *args, env={"SPECROUTER_KEY": "k1"}
    )
    assert "export OPENAI_BASE_URL=https://gw.example:8443/v1\n" in out
    assert "export OPENAI_API_KEY=k1\n" in out
    assert "SSL_CERT_FILE" not in out and "NODE_EXTRA_CA_CERTS" not in out
    ca = demo_state / "tls" / "ca.pem"
    out = connect(home, "anthropic", *args, "--ca", str(ca), "--key", "k2", "--write")
    env = (home / ".config" / "specrouter" / "anthropic.env").read_text()
    assert "export ANTHROPIC_BASE_URL=https://gw.example:8443\n" in env
    assert "export ANTHROPIC_API_KEY=k2\n" in env
    assert f"export NODE_EXTRA_CA_CERTS={ca.resolve()}\n" in env


def test_no_key_is_an_error_that_says_where_keys_come_from(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "connect", "codex", "--state-dir", str(tmp_path)],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("SPECROUTER_")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "--key" in done.stderr and "SPECROUTER_KEY" in done.stderr


def test_the_window_and_the_timeouts_written_come_from_the_gateways_figures(tmp_path: Path) -> None:
    from proxy.ops.connect.agents import Places, plan
    from proxy.ops.connect.gateway import Gateway

    gw = Gateway("https://gw:8443/v1", None, "sk", "coder", 131072, 330.0)
    places = Places(tmp_path / "config", tmp_path / "codex")
    codex = plan("codex", gw, places)
    provider = tomllib.loads(codex.files[0].text)["model_providers"]["specrouter"]
    assert provider["supports_websockets"] is False
    assert provider["stream_idle_timeout_ms"] == 360_000  # 330 s + 30 s
    profile = tomllib.loads(codex.files[1].text)
    assert profile["model_context_window"] == 131072
    assert profile["model_auto_compact_token_limit"] == 117964  # 10 % below
    env = json.loads(plan("claude-code", gw, places).files[0].text)["env"]
    assert env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "131072"
    assert env["API_TIMEOUT_MS"] == "600000"  # its default is above 360 s: kept
    assert env["CLAUDE_STREAM_IDLE_TIMEOUT_MS"] == "360000"
    assert env["API_FORCE_IDLE_TIMEOUT"] == "false"
    # Unknown figures (--no-check): the agents' own defaults stand, nothing is written for them.
    bare = plan("codex", Gateway("https://gw:8443/v1", None, "sk", "coder"), places)
    assert "stream_idle_timeout_ms" not in bare.files[0].text
    assert "model_context_window" not in bare.files[1].text


def test_the_codex_catalog_holds_the_instructions_read_and_the_window(tmp_path: Path) -> None:
    from proxy.ops.connect.agents import Places, plan
    from proxy.ops.connect.gateway import Gateway

    gw = Gateway("https://gw:8443/v1", None, "sk", "coder", 131072, 330.0)
    places = Places(tmp_path / "config", tmp_path / "codex")
    codex = plan("codex", gw, places, codex_instructions="Codex's own words")
    profile = tomllib.loads(codex.files[1].text)
    (catalog,) = [f for f in codex.files if str(f.path) == profile["model_catalog_json"]]
    assert catalog.path == tmp_path / "codex" / "specrouter.models.json"  # beside the profile
    (entry,) = json.loads(catalog.text)["models"]
    assert entry["slug"] == entry["display_name"] == "coder"
    assert entry["context_window"] == entry["max_context_window"] == 131072
    assert entry["base_instructions"] == "Codex's own words"
    assert "Codex's own words" not in (catalog.shown or "")  # printing does not show them
    assert "model_catalog_json" not in plan("codex", gw, places).files[1].text  # none read


def test_codex_instructions_are_refused_unless_codex_sent_them(tmp_path: Path) -> None:
    from proxy.ops.connect.codex_catalog import CatalogError, fallback_instructions, instructions_of

    first = {"role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]}
    assert instructions_of(json.dumps({"input": [first]}).encode()) == "Be brief."
    assert instructions_of(json.dumps({"instructions": "Be kind.", "input": []}).encode())
    user = {**first, "role": "user"}
    for nonsense in (b"<html>", b"[]", json.dumps({"input": [user]}).encode(), b'{"input": []}'):
        with pytest.raises(CatalogError):
            instructions_of(nonsense)
    with pytest.raises(CatalogError, match="sent no request"):
        fallback_instructions("coder", codex="true")  # a "codex" that asks nothing
    with pytest.raises(CatalogError, match="cannot run"):
        fallback_instructions("coder", codex=str(tmp_path / "missing"))
