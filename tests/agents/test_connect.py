"""`specrouter connect AGENT --write` in a temporary HOME, then the agent against the demo with
only what was written (its environment file sourced into an environment with no gateway setting
of its own): Codex `exec`, Claude Code `-p`, aider one message, the OpenAI (Python and Node) and
Anthropic SDKs one call each. The user's own settings survive; a file that changes is backed up.
And the newcomer's path as one test: the demo (`make demo`), then the README's commands as
printed."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.certs import CertFiles
from proxy.ops.connect.codex_catalog import first_request
from tests.agents.demo import ROOT, Demo
from tests.agents.recipes import recipes

pytestmark = pytest.mark.slow

# Variables through which an agent could find a gateway without the written files.
_GATEWAY_VARS = ("SPECROUTER_", "OPENAI_", "ANTHROPIC_", "AIDER_", "CODEX_", "CLAUDE_")
_CA_VARS = {"SSL_CERT_FILE", "SSL_CERT_DIR", "NODE_EXTRA_CA_CERTS", "REQUESTS_CA_BUNDLE"}


def bare_env(home: Path, *bins: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(_GATEWAY_VARS) and k not in _CA_VARS and k != "XDG_CONFIG_HOME"
    }
    env["HOME"] = str(home)
    env["PATH"] = os.pathsep.join([*map(str, bins), env["PATH"]])
    return env


def connect(
    demo: Demo, home: Path, agent: str, *extra: str, bins: tuple[Path, ...] = ()
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy.cli", "connect", agent, "--state-dir", str(demo.state)]
        + list(extra),
        cwd=ROOT,
        env=bare_env(home, *bins),
        capture_output=True,
        text=True,
        timeout=60,
    )


def write(demo: Demo, home: Path, agent: str, *bins: Path) -> str:
    """`connect AGENT --write`; with the agents' `bins` on its PATH (connect runs Codex)."""
    done = connect(demo, home, agent, "--write", bins=bins)
    assert done.returncode == 0, done.stderr
    return done.stdout


def sourced(
    home: Path, agent: str, command: str, cwd: Path, *bins: Path
) -> subprocess.CompletedProcess[str]:
    """`command` after sourcing the agent's written env file, and nothing else set."""
    env_file = home / ".config" / "specrouter" / f"{agent}.env"
    return subprocess.run(
        ["bash", "-c", f"source {env_file} && {command}"],
        cwd=cwd,
        env=bare_env(home, *bins),
        capture_output=True,
        text=True,
        timeout=60,
    )


def served(demo: Demo, since: float, out: str) -> None:
    rows = demo.rows(since)
    assert rows, out
    for row in rows:
        # Codex may hang up after the answer's finish was relayed (see test_codex.py).
        assert row["outcome"] == "ok" or (
            row["outcome"] == "client_gone" and row["finish_reason"] is not None
        ), dict(row)
        assert row["completion_tokens"] > 0


def npm_bin(agents: Path, name: str) -> Path:
    bin_dir = agents / "npm" / "node_modules" / ".bin"
    if not (bin_dir / name).exists():
        pytest.skip(f"{name} is not installed in {bin_dir} (scripts/agents.sh)")
    return bin_dir


def pinned() -> dict[str, str]:
    """scripts/agents.versions: package -> the version scripts/agents.sh installs."""
    lines = (ROOT / "scripts" / "agents.versions").read_text().splitlines()
    return {ln.split()[1]: ln.split()[2] for ln in lines if ln.strip() and not ln.startswith("#")}


def test_the_agents_run_here_are_the_pinned_versions(agents: Path) -> None:
    versions = pinned()
    assert set(versions) == {"@openai/codex", "@anthropic-ai/claude-code", "openai", "aider-chat"}
    docs = (ROOT / "docs" / "connect.md").read_text()
    for package, version in versions.items():
        assert version in docs, package  # docs/connect.md names the versions tested
        if package == "aider-chat":
            found = list(
                agents.glob(f"aider/lib/python3*/site-packages/aider_chat-{version}.dist-info")
            )
            assert found or not (agents / "aider" / "bin" / "aider").exists(), package
            continue
        manifest = agents / "npm" / "node_modules" / package / "package.json"
        if manifest.exists():
            assert json.loads(manifest.read_text())["version"] == version, package


def test_codex(demo: Demo, agents: Path, tmp_path: Path) -> None:
    bin_dir = npm_bin(agents, "codex")
    home, work = tmp_path / "home", tmp_path / "work"
    (home / ".codex").mkdir(parents=True)
    work.mkdir()
    config = home / ".codex" / "config.toml"
    mine = '# mine\nmodel = "gpt-5"\n\n[profiles.specrouter]\nmodel = "stale"\n\n[tui]\nanimations = false\n'
    config.write_text(mine)
    out = write(demo, home, "codex", bin_dir)
    (backup,) = config.parent.glob("config.toml.bak-*")
    assert backup.read_text() == mine, out
    doc = tomllib.loads(config.read_text())
    assert config.read_text().startswith("# mine\n")
    assert doc["model"] == "gpt-5" and doc["tui"] == {"animations": False}
    provider = doc["model_providers"]["specrouter"]
    assert provider["base_url"] == demo.base and provider["supports_websockets"] is False
    listed = _models(demo)
    window = next(m["max_model_len"] for m in listed["data"] if m["id"] == "qwen3.8-27b")
    profile = tomllib.loads((home / ".codex" / "specrouter.config.toml").read_text())
    assert profile["model_context_window"] == window > profile["model_auto_compact_token_limit"]
    assert provider["stream_idle_timeout_ms"] > listed["first_token_limit_s"] * 1000
    (model,) = json.loads(Path(profile["model_catalog_json"]).read_text())["models"]
    assert model["slug"] == "qwen3.8-27b" and model["context_window"] == window
    since = time.time()
    done = sourced(
        home,
        "codex",
        "codex exec --skip-git-repo-check --sandbox workspace-write -p specrouter 'List the files here'",
        work,
        bin_dir,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Model metadata" not in done.stdout + done.stderr  # what the catalog is for
    served(demo, since, done.stdout + done.stderr)
    _same_request_without_the_catalog(home, bin_dir)


def _same_request_without_the_catalog(home: Path, bin_dir: Path) -> None:
    """The profile (with its catalog) and the same provider and model without it: Codex sends
    the same instructions and tools, but for `spawn_agent`'s list of the catalog's models
    (without it: the bundled ones, which the gateway does not serve)."""
    env = {**bare_env(home, bin_dir), "SPECROUTER_KEY": "unused"}
    codex = str(bin_dir / "codex")

    def to(base: str, *args: str) -> list[str]:
        return [*args, "-c", f'model_providers.specrouter.base_url="{base}"']

    profiled = first_request(codex, lambda base: to(base, "-p", "specrouter"), env)
    bare = first_request(
        codex,
        lambda base: to(base, "-c", "model_provider=specrouter", "-c", 'model="qwen3.8-27b"'),
        env,
    )
    with_catalog, without = json.loads(profiled), json.loads(bare)
    assert _text(with_catalog["input"]) == _text(without["input"])
    assert _tools(with_catalog) == _tools(without)


def _text(items: list[dict[str, Any]]) -> list[str]:
    """The input's texts, but the environment context (cwd, date)."""
    texts = [str(c.get("text")) for item in items for c in item.get("content", [])]
    return [t for t in texts if not t.startswith("<environment_context>")]


def _tools(request: dict[str, Any]) -> list[Any]:
    """The tools, but the description of `spawn_agent` (it lists the catalog's models)."""
    tools = json.loads(json.dumps(request["tools"]))
    for tool in (t for group in tools for t in group.get("tools", [])):
        if tool.get("name") == "spawn_agent":
            tool.pop("description")
    return list(tools)


def test_codex_builtin_provider_falls_back_to_http_on_the_426(
    demo: Demo, agents: Path, tmp_path: Path
) -> None:
    """Codex's `openai` provider tries a WebSocket first; the gateway's 426 sends it to HTTP at
    once (any other answer costs it reconnect attempts)."""
    bin_dir = npm_bin(agents, "codex")
    home, work = tmp_path / "home", tmp_path / "work"
    (home / ".codex").mkdir(parents=True)
    work.mkdir()
    write(demo, home, "codex")  # for its CA bundle and key only: no -p below
    since = time.time()
    done = sourced(
        home,
        "codex",
        'CODEX_API_KEY="$SPECROUTER_KEY" codex exec --skip-git-repo-check -m qwen3.8-27b'
        " -c openai_base_url=\\\"$SPECROUTER_URL\\\" 'Say hi'",
        work,
        bin_dir,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "provider: openai" in out and "Responses WebSocket" in out, out  # it tried one
    assert "Reconnecting" not in out, out
    served(demo, since, out)


def _models(demo: Demo) -> dict[str, Any]:
    key = (demo.state / "client.key").read_text().strip()
    ca = ssl.create_default_context(cafile=str(demo.state / "tls" / "ca.pem"))
    got = httpx.get(f"{demo.base}/models", headers={"authorization": f"Bearer {key}"}, verify=ca)
    return dict(got.json())


def test_claude_code(demo: Demo, agents: Path, tmp_path: Path) -> None:
    bin_dir = npm_bin(agents, "claude")
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    (home / ".claude").mkdir(parents=True)
    users = json.dumps({"env": {"MY_SETTING": "1"}, "includeCoAuthoredBy": False})
    (home / ".claude" / "settings.json").write_text(users)
    ours = home / ".config" / "specrouter" / "claude-code.settings.json"
    ours.parent.mkdir(parents=True)
    ours.write_text("{}\n")  # an earlier, different version of our own file
    out = write(demo, home, "claude-code")
    assert (home / ".claude" / "settings.json").read_text() == users
    (backup,) = ours.parent.glob("claude-code.settings.json.bak-*")
    assert backup.read_text() == "{}\n", out
    settings = json.loads(ours.read_text())
    assert settings["env"]["ANTHROPIC_BASE_URL"] == demo.base.removesuffix("/v1")
    assert settings["env"]["CLAUDE_CODE_GATEWAY_HINT_HEADERS"] == "1"
    listed = _models(demo)
    window = next(m["max_model_len"] for m in listed["data"] if m["id"] == "qwen3.8-27b")
    assert settings["env"]["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == str(window)
    limit_ms = listed["first_token_limit_s"] * 1000
    assert int(settings["env"]["CLAUDE_STREAM_IDLE_TIMEOUT_MS"]) > limit_ms
    assert int(settings["env"]["API_TIMEOUT_MS"]) > limit_ms
    since = time.time()
    done = sourced(
        home, "claude-code", f"claude -p --settings {ours} 'List the files here'", work, bin_dir
    )
    assert done.returncode == 0, done.stdout + done.stderr
    served(demo, since, done.stdout + done.stderr)


def test_aider(demo: Demo, agents: Path, tmp_path: Path) -> None:
    bin_dir = agents / "aider" / "bin"
    if not (bin_dir / "aider").exists():
        pytest.skip(f"aider is not installed in {bin_dir} (scripts/agents.sh)")
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    users = "model: gpt-4o\ndark-mode: true\n"  # the user's own aider config, not ours
    (home / ".aider.conf.yml").write_text(users)
    write(demo, home, "aider")
    assert (home / ".aider.conf.yml").read_text() == users
    (work / "hello.py").write_text("def hello():\n    return 'hi'\n")
    conf = home / ".config" / "specrouter" / "aider.conf.yml"
    since = time.time()
    done = sourced(
        home,
        "aider",
        f"aider --config {conf} --yes-always --no-git --no-check-update --no-analytics"
        " --message 'Add a docstring to hello.py' hello.py",
        work,
        bin_dir,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    served(demo, since, out)
    assert "Model: openai/qwen3.8-27b" in out  # ours over the user's ~/.aider.conf.yml


OPENAI_CALL = """
from openai import OpenAI
r = OpenAI().chat.completions.create(model="qwen3.8-27b", max_tokens=16,
    messages=[{"role": "user", "content": "Hi"}])
print(r.choices[0].finish_reason)
"""
OPENAI_NODE_CALL = """
const OpenAI = require("openai");
new OpenAI().chat.completions.create({model: "qwen3.8-27b", max_tokens: 16,
  messages: [{role: "user", content: "Hi"}]}).then(r => console.log(r.choices[0].finish_reason));
"""
ANTHROPIC_CALL = """
import anthropic
m = anthropic.Anthropic().messages.create(model="qwen3.8-27b", max_tokens=16,
    messages=[{"role": "user", "content": "Hi"}])
print(m.stop_reason)
"""


def test_openai_sdks(demo: Demo, agents: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    write(demo, home, "openai")
    since = time.time()
    done = sourced(home, "openai", f"{sys.executable} -c '{OPENAI_CALL}'", tmp_path)
    assert done.returncode == 0 and done.stdout.strip() in {"length", "stop"}, done.stderr
    node_modules = agents / "npm" / "node_modules"
    if (node_modules / "openai").exists():
        node = f"NODE_PATH={node_modules} node -e '{OPENAI_NODE_CALL}'"
        done = sourced(home, "openai", node, tmp_path)
        assert done.returncode == 0 and done.stdout.strip() in {"length", "stop"}, done.stderr
    served(demo, since, "")


def test_anthropic_sdk(demo: Demo, tmp_path: Path) -> None:
    home = tmp_path / "home"
    write(demo, home, "anthropic")
    since = time.time()
    done = sourced(home, "anthropic", f"{sys.executable} -c '{ANTHROPIC_CALL}'", tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() in {"max_tokens", "end_turn"}, done.stdout
    served(demo, since, "")


def test_a_wrong_ca_is_said_before_anything_is_written(
    demo: Demo, certs: CertFiles, tmp_path: Path
) -> None:
    done = connect(
        demo,
        tmp_path,
        "codex",
        "--url",
        demo.base,
        "--key",
        demo.key,
        "--ca",
        str(certs.ca_cert),
        "--write",
    )
    assert done.returncode == 1
    assert "certificate is not verified by the CA file" in done.stderr
    done = connect(demo, tmp_path, "codex", "--key", "sk-wrong", "--write")
    assert done.returncode == 1 and "refused this client key" in done.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("recipe", "binary", "written"),
    [
        ("connect-codex", "codex", ".codex/specrouter.config.toml"),
        ("connect-claude-code", "claude", ".config/specrouter/claude-code.settings.json"),
    ],
)
def test_newcomer_path(
    demo: Demo, agents: Path, tmp_path: Path, recipe: str, binary: str, written: str
) -> None:
    """`make demo` (the demo of this folder), then the README's commands as printed, from a
    clone (here: a folder with the clone's .venv and the demo's state as .state/demo), in a
    HOME with nothing but what `connect` writes and a PATH without `specrouter`."""
    bin_dir = npm_bin(agents, binary)
    clone, home = tmp_path / "clone", tmp_path / "home"
    (clone / ".state").mkdir(parents=True)
    home.mkdir()
    (clone / ".venv").symlink_to(Path(sys.executable).parents[1])
    (clone / ".state" / "demo").symlink_to(demo.state)
    env = bare_env(home, bin_dir)
    env["PATH"] = os.pathsep.join(
        p for p in env["PATH"].split(os.pathsep) if not (Path(p) / "specrouter").exists()
    )
    env.pop("VIRTUAL_ENV", None)
    since = time.time()
    done = subprocess.run(
        ["bash", "-c", recipes("README.md")[recipe]],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert (home / written).exists()
    served(demo, since, out)
