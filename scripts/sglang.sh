#!/usr/bin/env bash
# SGLang's serving code for scripts/sglang_golden.py (the frozen bytes in
# tests/fixtures/sglang-golden/): sglang 0.5.23 in its own venv, cached OUTSIDE the clone, made
# only when missing; prints the venv's directory. Override it with SPECROUTER_SGLANG_DIR.
# Not for `make test`: SGLang's server does not run on this CPU (docs/backends.md, *SGLang
# engines*), and the tests read the frozen bytes, not this venv.
#
# The wheel pins torch 2.14.1 and CUDA kernels (sglang-kernel, flashinfer, flash-attn, DeepEP,
# ...); only its serving and metrics code is run, so the wheel goes in with --no-deps, then its
# requirements without the GPU packages and torch, next to vLLM's CPU torch. torchvision is left
# out (no CPU build for this torch); scripts/sglang_golden.py stands in for it.
set -euo pipefail
SGLANG_VERSION=0.5.23
TORCH_VERSION=2.13.0
dir="${SPECROUTER_SGLANG_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/specrouter/sglang}"
venv="$dir/venv"
stamp="$venv/.installed-sglang-$SGLANG_VERSION"
mkdir -p "$dir"
exec 9>"$dir/.lock"
flock 9
if [ ! -f "$stamp" ]; then
    py="$(command -v python3.11 || command -v python3)"
    rm -rf "$venv"
    "$py" -m venv "$venv" >&2
    pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
    "${pip[@]}" "torch==$TORCH_VERSION" >&2
    "${pip[@]}" --no-deps "sglang==$SGLANG_VERSION" >&2
    "$venv/bin/python" - "$dir/requirements.txt" <<'PY'
import importlib.metadata
import re
import sys

gpu = {
    "torch", "torchaudio", "torchvision", "torchcodec", "cuda-python", "flash-attn-4",
    "flashinfer-python", "humming-kernels", "nvidia-cutlass-dsl", "nvidia-mathdx",
    "nvshmem4py-cu13", "quack-kernels", "sgl-deep-ep", "sgl-deep-gemm", "sgl-flash-mla",
    "sglang-kernel", "tilelang", "torch-memory-saver", "deepseek-recipe", "apache-tvm-ffi",
    "kernels", "py-spy", "datasets", "modelscope", "timm", "soundfile", "mistral-common",
    "smg-grpc-servicer", "tml-renderers", "decord2", "av", "numba",
}
keep = []
for req in importlib.metadata.requires("sglang") or []:
    name = re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0].lower().replace("_", "-")
    if name in gpu or "extra ==" in req:
        continue
    keep.append(req)
open(sys.argv[1], "w").write("\n".join(keep) + "\n")
PY
    "${pip[@]}" -r "$dir/requirements.txt" "torch==$TORCH_VERSION" ipython dill >&2
    touch "$stamp"
fi
echo "$venv"
