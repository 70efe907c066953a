"""What each agent reads, for one gateway: the files `--write` writes and the command using them.

Every agent gets an environment file of its own to `source` (the key, the CA setting its runtime
reads; 0600); what else it reads:

    codex        `[model_providers.NAME]` merged into `$CODEX_HOME/config.toml` and the profile
                 `$CODEX_HOME/NAME.config.toml` (`codex -p NAME` layers it on the user's config;
                 Codex 0.171 refuses `-p NAME` while a legacy `[profiles.NAME]` table exists, so
                 that table goes); the profile names the catalog `$CODEX_HOME/NAME.models.json`
                 when the installed Codex's instructions were read (codex_catalog.py). CA:
                 SSL_CERT_FILE, without which Codex loops on "Reconnecting..." with no hint.
    claude-code  a settings file of its own (`claude --settings FILE`): base URL without /v1, the
                 model for every tier, the gateway hint headers, the key through apiKeyHelper.
                 CA: NODE_EXTRA_CA_CERTS.
    aider        a config file of its own (`aider --config FILE`). CA: SSL_CERT_FILE.
    openai       the SDKs' own variables (Python and Node): OPENAI_BASE_URL, OPENAI_API_KEY.
    anthropic    ANTHROPIC_BASE_URL (no /v1), ANTHROPIC_API_KEY.

SSL_CERT_FILE names a bundle of the system's CAs and the gateway's (it replaces the default roots;
NODE_EXTRA_CA_CERTS adds to them, so it names the gateway's CA alone).
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from proxy.ops.connect.codex_catalog import catalog_text
from proxy.ops.connect.files import Planned, ca_bundle, merge_toml, system_roots
from proxy.ops.connect.gateway import Gateway
from proxy.ops.connect.quoting import (
    checked,
    json_text,
    shell_env,
    shell_words,
    toml_text,
    yaml_text,
)

AGENTS = ("codex", "claude-code", "aider", "openai", "anthropic")
# The agents' own defaults (docs/connect.md): a timeout written is never below its default.
CODEX_IDLE_MS = 300_000  # stream_idle_timeout_ms
CLAUDE_REQUEST_MS = 600_000  # API_TIMEOUT_MS
CLAUDE_IDLE_MS = 300_000  # CLAUDE_STREAM_IDLE_TIMEOUT_MS (2.1.197 floors it there too)


def _some(**values: int | None) -> dict[str, int]:
    """The settings whose value is known."""
    return {k: v for k, v in values.items() if v is not None}


@dataclass(frozen=True)
class Plan:
    agent: str
    files: list[Planned]
    run: list[str]  # how to use what was written
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Places:
    config: Path  # our own files: env files, settings, the CA bundle
    codex_home: Path


def default_places() -> Places:
    home = Path.home()
    config = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config") / "specrouter"
    return Places(config, Path(os.environ.get("CODEX_HOME") or home / ".codex"))


def plan(
    agent: str,
    gw: Gateway,
    places: Places,
    name: str = "specrouter",
    codex_instructions: str | None = None,
) -> Plan:
    """`codex_instructions`: what the installed Codex sends for the model without a catalog
    entry (codex_catalog.fallback_instructions); None: no catalog is written."""
    if agent == "codex":
        return _codex(gw, places, name, codex_instructions)
    builders = {
        "claude-code": _claude_code,
        "aider": _aider,
        "openai": _openai,
        "anthropic": _anthropic,
    }
    return builders[agent](gw, places, name)


def _env_file(agent: str, gw: Gateway, places: Places, run: str, extra: dict[str, str]) -> Planned:
    use = f"`specrouter connect {agent}`: this gateway for {agent}. Use: source this file, then"
    env = {"SPECROUTER_URL": gw.url, "SPECROUTER_KEY": gw.key}
    if gw.ca is not None:
        env["SPECROUTER_CA"] = str(gw.ca)
    text = shell_env([use, f"  {run}"], {**env, **extra})
    return Planned(places.config / f"{agent}.env", text, private=True)


def _source(env_file: Planned, run: str) -> str:
    return f"{shell_words(['source', str(env_file.path)])} && {run}"


def _tls(
    gw: Gateway, places: Places, *, python: bool, node: bool
) -> tuple[dict[str, str], list[Planned]]:
    """The CA variables a runtime reads, and the bundle file SSL_CERT_FILE names."""
    if gw.ca is None:
        return {}, []
    env: dict[str, str] = {}
    files: list[Planned] = []
    if python:
        bundle = places.config / "ca-bundle.pem"
        env["SSL_CERT_FILE"] = str(bundle)
        shown = f"(the system's CAs, {system_roots()}, then the gateway's, {gw.ca})\n"
        files.append(Planned(bundle, ca_bundle(gw.ca), shown=shown))
    if node:
        env["NODE_EXTRA_CA_CERTS"] = str(gw.ca)
    return env, files


def _codex(gw: Gateway, places: Places, name: str, instructions: str | None) -> Plan:
    provider: dict[str, str | int | bool] = {
        "name": name,
        "base_url": gw.url,
        "env_key": "SPECROUTER_KEY",
        "wire_api": "responses",
        "supports_websockets": False,  # the gateway answers a WebSocket 426
        **_some(stream_idle_timeout_ms=gw.timeout_ms(CODEX_IDLE_MS)),
    }
    config = places.codex_home / "config.toml"
    merge = functools.partial(
        merge_toml,
        path=("model_providers", name),
        table=checked(provider),
        unset=(("profiles", name),),
        unset_equal=(("profile", name),),
    )
    fragment = toml_text({"model_providers": {name: provider}})
    catalog: list[Planned] = []
    if instructions is not None:  # in the profile: the user's other providers keep theirs
        path = places.codex_home / f"{name}.models.json"
        shown = f"(an entry for {gw.model}: Codex's fallback metadata and instructions)\n"
        catalog.append(Planned(path, catalog_text(gw.model, gw.window, instructions), shown=shown))
    profile = toml_text(
        {
            "model": gw.model,
            "model_provider": name,
            **_some(
                model_context_window=gw.window, model_auto_compact_token_limit=gw.compact_limit
            ),
            **({"model_catalog_json": str(catalog[0].path)} if catalog else {}),
        }
    )
    run = shell_words(["codex", "-p", name])
    env, bundle = _tls(gw, places, python=True, node=False)
    files = [
        Planned(config, fragment, merge=merge),
        Planned(places.codex_home / f"{name}.config.toml", profile),
        _env_file("codex", gw, places, run, env),
        *bundle,
        *catalog,
    ]
    notes = [
        f"{config}: only [model_providers.{name}] is added or replaced, and a legacy"
        f" [profiles.{name}] (Codex refuses it beside -p {name}) removed; the rest stays"
    ]
    # Codex refuses to run outside a git repository unless told this (the newcomer's first try).
    once = shell_words(
        ["codex", "exec", "--skip-git-repo-check", "-p", name, "List the files here"]
    )
    notes.append("`codex exec` (one task) outside a git repository needs --skip-git-repo-check")
    return Plan("codex", files, [_source(files[2], run), _source(files[2], once)], notes)


def _claude_code(gw: Gateway, places: Places, name: str) -> Plan:
    settings_path = places.config / "claude-code.settings.json"
    env = {
        "ANTHROPIC_BASE_URL": gw.root,
        "ANTHROPIC_MODEL": gw.model,
        # side requests (titles, subagents) name a tier: each tier is the gateway's model
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": gw.model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": gw.model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": gw.model,
        # request class, agent type, compaction... as x-claude-code-* headers (2.1.273+)
        "CLAUDE_CODE_GATEWAY_HINT_HEADERS": "1",
        # the window of a model not named claude-*; the timeouts above the gateway's limit
        **{
            k: str(v)
            for k, v in _some(
                CLAUDE_CODE_MAX_CONTEXT_TOKENS=gw.window,
                API_TIMEOUT_MS=gw.timeout_ms(CLAUDE_REQUEST_MS),
                CLAUDE_STREAM_IDLE_TIMEOUT_MS=gw.timeout_ms(CLAUDE_IDLE_MS),
            ).items()
        },
        # its HTTP client's own ~300 s limit on a host that is not Anthropic's, lifted
        "API_FORCE_IDLE_TIMEOUT": "false",
    }
    settings = {"env": env, "apiKeyHelper": 'printf %s "$SPECROUTER_KEY"'}
    run = shell_words(["claude", "--settings", str(settings_path)])
    tls, _ = _tls(gw, places, python=False, node=True)
    env_file = _env_file("claude-code", gw, places, run, tls)
    files = [Planned(settings_path, json_text(settings)), env_file]
    return Plan("claude-code", files, [_source(env_file, run)])


def _aider(gw: Gateway, places: Places, name: str) -> Plan:
    conf_path = places.config / "aider.conf.yml"
    conf = {
        "model": f"openai/{gw.model}",
        "openai-api-base": gw.url,
        "show-model-warnings": False,  # the gateway's model is not in litellm's table
    }
    run = shell_words(["aider", "--config", str(conf_path)])
    tls, bundle = _tls(gw, places, python=True, node=False)
    env_file = _env_file("aider", gw, places, run, {"AIDER_OPENAI_API_KEY": gw.key, **tls})
    files = [Planned(conf_path, yaml_text(conf)), env_file, *bundle]
    return Plan("aider", files, [_source(env_file, run)])


def _openai(gw: Gateway, places: Places, name: str) -> Plan:
    tls, bundle = _tls(gw, places, python=True, node=True)
    env = {"OPENAI_BASE_URL": gw.url, "OPENAI_API_KEY": gw.key, **tls}
    # the model as a Python string literal (JSON's), the program as one quoted shell word
    code = f"import openai; print(openai.OpenAI().models.retrieve({json.dumps(gw.model)}))"
    run = shell_words(["python", "-c", code])
    env_file = _env_file("openai", gw, places, run, env)
    return Plan("openai", [env_file, *bundle], [_source(env_file, run)], [f"model: {gw.model}"])


def _anthropic(gw: Gateway, places: Places, name: str) -> Plan:
    tls, bundle = _tls(gw, places, python=True, node=True)
    env = {"ANTHROPIC_BASE_URL": gw.root, "ANTHROPIC_API_KEY": gw.key, **tls}
    run = "python  # anthropic.Anthropic() reads ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY"
    env_file = _env_file("anthropic", gw, places, run, env)
    source = shell_words(["source", str(env_file.path)])
    return Plan("anthropic", [env_file, *bundle], [source], [f"model: {gw.model}"])
