"""`specrouter connect AGENT --write` in a temporary HOME, then the agent against the demo with
only what was written (its environment file sourced into an environment with no gateway setting
of its own): Codex `exec`, Claude Code `-p`, aider one message, the OpenAI (Python and Node) and
Anthropic SDKs one call each. The user's own settings survive; a file that changes is backed up.
And the newcomer's path as one test: the demo (`make demo`), then docs/connect.md's commands as
printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from proxy.certs import CertFiles
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


def connect(demo: Demo, home: Path, agent: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy.cli", "connect", agent, "--state-dir", str(demo.state)]
        + list(extra),
        cwd=ROOT,
        env=bare_env(home),
        capture_output=True,
        text=True,
        timeout=60,
    )


def write(demo: Demo, home: Path, agent: str) -> str:
    done = connect(demo, home, agent, "--write")
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
    out = write(demo, home, "codex")
    (backup,) = config.parent.glob("config.toml.bak-*")
    assert backup.read_text() == mine, out
    doc = tomllib.loads(config.read_text())
    assert config.read_text().startswith("# mine\n")
    assert doc["model"] == "gpt-5" and doc["tui"] == {"animations": False}
    assert doc["model_providers"]["specrouter"]["base_url"] == demo.base
    since = time.time()
    done = sourced(
        home,
        "codex",
        "codex exec --skip-git-repo-check --sandbox workspace-write -p specrouter 'List the files here'",
        work,
        bin_dir,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    served(demo, since, done.stdout + done.stderr)


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


def test_newcomer_path(demo: Demo, agents: Path, tmp_path: Path) -> None:
    """`make demo` (the demo of this folder), then docs/connect.md's commands as printed, from a
    clone (here: a folder with the clone's .venv and the demo's state as .state/demo)."""
    bin_dir = npm_bin(agents, "codex")
    clone, home = tmp_path / "clone", tmp_path / "home"
    (clone / ".state").mkdir(parents=True)
    home.mkdir()
    (clone / ".venv").symlink_to(Path(sys.executable).parents[1])
    (clone / ".state" / "demo").symlink_to(demo.state)
    since = time.time()
    done = subprocess.run(
        ["bash", "-c", recipes("docs/connect.md")["connect-codex"]],
        cwd=clone,
        env=bare_env(home, bin_dir),
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert (home / ".codex" / "specrouter.config.toml").exists()
    served(demo, since, out)
