#!/usr/bin/env bash
# The coding agents tests/agents/ drives against the demo, installed OUTSIDE the clone at exactly
# the versions pinned in scripts/agents.versions: Codex CLI, Claude Code and the openai SDK for
# Node (npm; docs/clients.md's Node recipe), aider (its own Python 3.11 venv: aider-chat needs Python < 3.13). A package whose
# installed version differs from its pin (or is missing) is (re)installed; warm, nothing is.
# Prints the cache directory. Override it with SPECROUTER_AGENTS_DIR.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dir="${SPECROUTER_AGENTS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/specrouter/agents}"
mkdir -p "$dir"
# Several clones share the cache: one installer at a time.
exec 9>"$dir/.lock"
flock 9

npm_stale=()
pip_stale=()
while read -r installer package version; do
    case "$installer" in
        npm)
            have=""
            if [ -f "$dir/npm/node_modules/$package/package.json" ] && command -v node >/dev/null 2>&1; then
                have="$(node -p "require(process.argv[1]).version" "$dir/npm/node_modules/$package/package.json")"
            fi
            [ "$have" = "$version" ] || npm_stale+=("$package@$version")
            ;;
        pip)
            have=""
            if [ -x "$dir/aider/bin/python" ]; then
                have="$("$dir/aider/bin/python" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$package" 2>/dev/null || true)"
            fi
            [ "$have" = "$version" ] || pip_stale+=("$package==$version")
            ;;
    esac
done < <(grep -v '^#' "$here/agents.versions" | grep -v '^[[:space:]]*$')

if [ ${#npm_stale[@]} -gt 0 ]; then
    if command -v npm >/dev/null 2>&1; then
        echo "agents: installing ${npm_stale[*]}" >&2
        npm install --prefix "$dir/npm" --save-exact --no-audit --no-fund --loglevel=error \
            "${npm_stale[@]}" >&2 || echo "agents: npm install failed" >&2
    else
        echo "agents: npm is missing (${npm_stale[*]} not installed)" >&2
    fi
fi
if [ ${#pip_stale[@]} -gt 0 ]; then
    py="$(command -v python3.11 || command -v python3.12 || true)"
    if [ -z "$py" ]; then
        echo "agents: aider needs python3.11 or python3.12" >&2
    else
        [ -x "$dir/aider/bin/python" ] || "$py" -m venv "$dir/aider" >&2
        echo "agents: installing ${pip_stale[*]}" >&2
        "$dir/aider/bin/python" -m pip install -q "${pip_stale[@]}" >&2 || echo "agents: aider install failed" >&2
    fi
fi
echo "$dir"
