"""vLLM releases: the flag tables, how they are made, and the render/check that follows them."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from policies.schema import load_policy, validate_policy
from proxy.ops import deploy
from proxy.ops.deploy import flagtable, versions

ROOT = Path(__file__).resolve().parents[2]
GB10 = ROOT / "policies" / "gb10.yaml"  # the deployed engine alone
THREE = ROOT / "loadtests" / "bench" / "sweep" / "gb10-three.yaml"  # three co-located engines

# What the deployment relies on, per release (read from each release's wheel).
FLAGS = [
    "--max-model-len",
    "--gpu-memory-utilization",
    "--kv-cache-memory-bytes",
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "--reasoning-parser",
    "--enable-prompt-tokens-details",
    "--enable-request-id-headers",
    "--speculative-config",
    "--served-model-name",
    "--max-num-seqs",
    "--runner",
    "--scheduling-policy",
    "--no-enable-prefix-caching",
    "--host",
    "--port",
    "--api-key",
]


@pytest.mark.parametrize("version", versions.SUPPORTED)
def test_every_table_has_the_flags_the_deployment_uses(version: str) -> None:
    table = versions.flags(version)
    assert set(FLAGS) <= table, set(FLAGS) - table
    assert len(table) > 300
    text = (versions.TABLES / f"{version}.txt").read_text()
    assert text.startswith(f"# vLLM {version} `vllm serve` flags")
    assert "sha256" in text.splitlines()[1] and "built from commit" in text.splitlines()[1]
    flags = [line for line in text.splitlines() if not line.startswith("#")]
    assert flags == sorted(flags) and len(flags) == len(set(flags))


@pytest.mark.parametrize(
    ("version", "has"), [("0.28.0", False), ("0.29.0", True), ("0.31.0", True), ("0.33.0", True)]
)
def test_the_per_request_summary_arrives_in_029(version: str, has: bool) -> None:
    assert versions.has_flag(version, versions.PER_REQUEST_SPEC_FLAG) is has


def test_flags_are_read_as_vllm_reads_them() -> None:
    assert versions.normalise_flag("--max_model_len") == "--max-model-len"
    assert versions.normalise_flag("--speculative-config.method") == "--speculative-config"
    assert versions.unknown_flags(
        "0.28.0", ["--max_model_len", "--no-such-flag", "per-request-spec-decode-metrics"]
    ) == ["--no-such-flag", "per-request-spec-decode-metrics"]
    with pytest.raises(versions.UnknownRelease, match="0.27.0 has no flag table"):
        versions.flags("0.27.0")


# A miniature vLLM, shaped like a release's wheel: the generator must find every flag kind.
MINI = {
    "vllm/_version.py": "version = '9.9.9'\ncommit_id = 'gabc1234'\n",
    "vllm/entrypoints/cli/serve.py": "from vllm.entrypoints.openai.cli_args import "
    "make_arg_parser\n",
    "vllm/entrypoints/openai/cli_args.py": "from vllm.entrypoints.launchers.cli_args import "
    "make_arg_parser\n",
    "vllm/entrypoints/launchers/cli_args.py": """
from typing import ClassVar
class BaseFrontendArgs:
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    lazy: ClassVar[int] = 1
class FrontendArgs(BaseFrontendArgs):
    port: int = 8000
    ssl: bool | str | None = None
def make_arg_parser(parser):
    parser.add_argument("model_tag", nargs="?")
    parser.add_argument("--headless", action="store_true")
    parser = FrontendArgs.add_cli_args(parser)
    parser = AsyncEngineArgs.add_cli_args(parser)
    return parser
""",
    "vllm/config/__init__.py": "from vllm.config.cache import CacheConfig\n",
    "vllm/config/cache.py": "class CacheConfig:\n    enable_prefix_caching: bool = True\n"
    "    kv_cache_memory_bytes: int | None = None\n",
    "vllm/engine/arg_utils.py": """
import argparse
from vllm.config import CacheConfig
class EngineArgs:
    @staticmethod
    def add_cli_args(parser):
        cache_kwargs = get_kwargs(CacheConfig)
        parser.add_argument("--enable-prefix-caching",
                            **{**cache_kwargs["enable_prefix_caching"], "default": None})
        parser.add_argument("--kv-cache-memory-bytes", **cache_kwargs["kv_cache_memory_bytes"])
        parser.add_argument("--quantization", "-q", type=str)
        return parser
class AsyncEngineArgs(EngineArgs):
    @staticmethod
    def add_cli_args(parser):
        parser = EngineArgs.add_cli_args(parser)
        parser.add_argument("--enable-log-requests", action=argparse.BooleanOptionalAction)
        return parser
""",
}
MINI_FLAGS = [
    "--enable-auto-tool-choice",
    "--enable-log-requests",
    "--enable-prefix-caching",
    "--headless",
    "--kv-cache-memory-bytes",
    "--no-enable-auto-tool-choice",
    "--no-enable-log-requests",
    "--no-enable-prefix-caching",
    "--port",
    "--quantization",
    "--ssl",
    "--tool-call-parser",
]


def test_the_generator_reads_a_source_tree_and_a_wheel(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = tmp_path / "src"
    wheel = tmp_path / "vllm-9.9.9-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for rel, text in MINI.items():
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            (tree / rel).write_text(text)
            archive.writestr(rel, text)
    read, label = flagtable.source_reader(tree)
    assert flagtable.serve_flags(read) == MINI_FLAGS
    assert flagtable.release_of(read) == ("9.9.9", "abc1234")
    assert flagtable.main([str(wheel)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# vLLM 9.9.9 `vllm serve` flags")
    assert "vllm-9.9.9-py3-none-any.whl (sha256 " in out and "commit abc1234" in out
    assert "vllm/entrypoints/launchers/cli_args.py" in out
    assert [line for line in out.splitlines() if not line.startswith("#")] == MINI_FLAGS


# -- render and check per release ---------------------------------------------------------------


def _gb10(version: str, path: Path = GB10) -> dict[str, Any]:
    raw: dict[str, Any] = yaml.safe_load(path.read_text())
    raw["deployment"] = {**raw["deployment"], "vllm_version": version}
    return raw


def test_029_adds_the_per_request_summary_and_its_check(tmp_path: Path) -> None:
    doc = validate_policy(_gb10("0.29.0"))
    policy = tmp_path / "p.yaml"
    policy.write_text(yaml.safe_dump(_gb10("0.29.0")))
    files = deploy.render(doc, policy=policy, out_dir=tmp_path)
    compose = yaml.safe_load(files["compose.yaml"])
    dflash = compose["services"]["coder-dflash7"]
    assert "--per-request-spec-decode-metrics=summary" in dflash["command"]
    assert dflash["image"].endswith("v0.29.0}")
    assert (
        "--per-request-spec-decode-metrics=summary"
        not in compose["services"]["embed-large"]["command"]
    )
    assert deploy.check_compose(doc, compose) == []
    dflash["command"].remove("--per-request-spec-decode-metrics=summary")
    assert any(
        "--per-request-spec-decode-metrics is None, not 'summary'" in d
        for d in deploy.check_compose(doc, compose)
    )


def test_the_shipped_028_compose_passes_and_its_split_holds_every_max_model_len() -> None:
    doc = load_policy(GB10)
    assert doc.deployment.vllm_version == "0.28.0"
    plans, _ = deploy.engine_plans(doc)
    coders = [p for p in plans if p.memory is not None]
    assert len(coders) == 1 and coders[0].max_model_len == 262144
    assert all(p.memory is not None and p.memory.holds_max_model_len for p in coders)
    compose = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())
    assert deploy.check_compose(doc, compose) == []
    for service in compose["services"].values():
        assert "--per-request-spec-decode-metrics=summary" not in service.get("command", [])


def test_a_wrong_split_is_refused(tmp_path: Path) -> None:
    """The old render: 0.26 each and no --max-model-len (262,144) leaves a few GiB of KV."""
    doc = load_policy(GB10)
    compose = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())
    for name in ("coder-dflash7",):
        command = compose["services"][name]["command"]
        compose["services"][name]["command"] = [
            "--gpu-memory-utilization=0.26" if a.startswith("--gpu-memory-utilization") else a
            for a in command
            if not a.startswith(("--kv-cache-memory-bytes", "--max-model-len"))
        ]
    diffs = deploy.check_compose(doc, compose)
    refused = [d for d in diffs if "vLLM refuses to start it" in d]
    assert len(refused) == 1, diffs
    assert any(
        "coder-dflash7" in d and "less than one --max-model-len 262,144" in d for d in refused
    )


def test_a_policy_whose_engines_cannot_fit_is_not_rendered(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    raw = _gb10("0.28.0", THREE)
    for name in ("coder-dflash7", "coder-dflash5", "coder-mtp3"):
        raw["backends"][name]["engine"]["max_model_len"] = 262144
    policy = tmp_path / "full.yaml"
    policy.write_text(yaml.safe_dump(raw))
    assert deploy.main(["render", str(policy), "--out", str(tmp_path / "out")]) == 2
    assert "lower max_model_len" in capsys.readouterr().err
    raw["deployment"]["vllm_version"] = "0.27.0"
    policy.write_text(yaml.safe_dump(raw))
    assert deploy.main(["render", str(policy)]) == 2
    assert "0.27.0 has no flag table" in capsys.readouterr().err


def test_render_and_policy_check_print_each_engines_kv(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from proxy.cli import main as specrouter

    assert deploy.main(["render", str(GB10), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert specrouter(["policy", "check", str(GB10)]) == 0
    checked = capsys.readouterr().out
    for name in ("coder-dflash7",):
        line = next(x for x in out.splitlines() if f"vLLM 0.28.0 {name}:" in x)
        assert "KV tokens" in line and "x 262K" in line and "x 100K" in line and "fits" in line
        assert line in checked
    assert "valid" in checked


def test_hermes_is_the_alternative_parser() -> None:
    raw = _gb10("0.28.0", THREE)
    raw["backends"]["coder-mtp3"]["engine"]["tool_call_parser"] = "hermes"
    doc = validate_policy(raw)
    plans, _ = deploy.engine_plans(doc)
    mtp = next(p for p in plans if p.backend == "coder-mtp3")
    assert "--tool-call-parser=hermes" in deploy.engine_command(mtp)
    raw["backends"]["embed-small"]["engine"] = {"tool_call_parser": "hermes"}
    with pytest.raises(ValueError, match="embed backend has no tool-call"):
        validate_policy(raw)
