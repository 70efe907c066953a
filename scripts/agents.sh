#!/usr/bin/env bash
# The coding agents tests/agents/ drives against the demo, installed OUTSIDE the clone and only
# when missing: Codex CLI, Claude Code and the openai SDK for Node (npm; docs/clients.md's Node recipe),
# aider (its own Python 3.11 venv: aider-chat needs Python < 3.13). Prints the cache directory. Override it with SPECROUTER_AGENTS_DIR.
set -euo pipefail
dir="${SPECROUTER_AGENTS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/specrouter/agents}"
mkdir -p "$dir"
bin="$dir/npm/node_modules/.bin"
if command -v npm >/dev/null 2>&1 && { [ ! -x "$bin/codex" ] || [ ! -x "$bin/claude" ] || [ ! -d "$dir/npm/node_modules/openai" ]; }; then
    npm install --prefix "$dir/npm" --no-audit --no-fund --loglevel=error \
        @openai/codex @anthropic-ai/claude-code openai >&2 || echo "agents: npm install failed" >&2
fi
if [ ! -x "$dir/aider/bin/aider" ]; then
    py="$(command -v python3.11 || command -v python3.12 || true)"
    if [ -n "$py" ]; then
        "$py" -m venv "$dir/aider" >&2
        "$dir/aider/bin/python" -m pip install -q aider-chat >&2 || echo "agents: aider install failed" >&2
    else
        echo "agents: aider needs python3.11 or python3.12" >&2
    fi
fi
echo "$dir"
