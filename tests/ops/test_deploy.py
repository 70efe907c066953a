"""`specrouter deploy`: the rendered stack is valid, in sync with the GB10 policy, and checkable."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from policies.schema import load_policy, validate_policy
from proxy.ops import deploy
from proxy.ops.deploy import draft_schedule as deploy_schedule
from proxy.ops.deploy import secret_env
from proxy.ops.deploy.cli import memory_report

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
GB10 = ROOT / "policies" / "gb10.yaml"  # shipped: the deployed engine alone, whole machine
THREE = ROOT / "loadtests/bench/sweep/gb10-three.yaml"  # the former default: three engines
PAIR = ROOT / "policies" / "gb10-pair.yaml"  # two or more GB10s, one engine each
DEMO = ROOT / "policies" / "demo.yaml"
PROMTOOL = shutil.which("promtool")
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")


def _render(policy: Path, out: Path) -> dict[str, Any]:
    assert deploy.main(["render", str(policy), "--out", str(out)]) == 0
    data: dict[str, Any] = yaml.safe_load((out / "compose.yaml").read_text())
    return data


def _command(service: dict[str, Any]) -> list[str]:
    return [*service.get("entrypoint", []), *service["command"]]


def _spec(service: dict[str, Any]) -> dict[str, Any]:
    arg = next(a for a in service["command"] if a.startswith("--speculative-config="))
    value: dict[str, Any] = json.loads(arg.split("=", 1)[1])
    return value


# -- the rendered files -------------------------------------------------------------------------


def test_rendered_compose_has_the_three_engine_stack(tmp_path: Path) -> None:
    compose = _render(THREE, tmp_path)
    services = compose["services"]
    assert set(services) == {
        "coder-dflash7",
        "coder-dflash5",
        "coder-mtp3",
        "embed-large",
        "embed-small",
        "gateway",
        "prometheus",
        "grafana",
    }
    for name, service in services.items():
        assert "image" in service or "build" in service, name
        assert service["network_mode"] == "host", name
        assert service["restart"] == "unless-stopped", name
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith((".", "/", "$")):
                assert source in compose["volumes"], (name, volume)

    dflash = services["coder-dflash7"]
    assert dflash["entrypoint"] == ["vllm", "serve"]
    assert dflash["labels"][deploy.BACKEND_LABEL] == "coder-dflash7"
    args = dflash["command"]
    for flag in (
        "--served-model-name=qwen3.8-27b",
        "--max-num-seqs=16",
        "--port=8001",
        "--host=127.0.0.1",
        "--max-model-len=131072",
        "--enable-auto-tool-choice",
        "--tool-call-parser=qwen3_coder",
        "--reasoning-parser=qwen3",
        "--enable-prompt-tokens-details",
        "--enable-request-id-headers",
    ):
        assert flag in args
    # 0.28.0 has no per-request spec summary (0.29+): the flag would stop the engine.
    assert not any(a.startswith("--per-request-spec-decode-metrics") for a in args)
    assert dflash["image"] == "${VLLM_IMAGE:-vllm/vllm-openai:v0.28.0}"
    assert any(
        a.startswith("--gpu-memory-utilization=${GPU_MEMORY_CODER_DFLASH7:-0.") for a in args
    )
    assert any(
        a.startswith("--kv-cache-memory-bytes=${KV_CACHE_BYTES_CODER_DFLASH7:-") for a in args
    )
    spec = _spec(dflash)
    assert spec["method"] == "dflash" and spec["num_speculative_tokens"] == 7
    assert spec["draft_sample_method"] == "probabilistic"
    assert spec["rejection_sample_method"] == "block"
    assert spec["model"].startswith("${DRAFTER_CODER_DFLASH7:-")
    assert _spec(services["coder-mtp3"]) == {"method": "mtp", "num_speculative_tokens": 3}
    assert "--runner=pooling" in services["embed-small"]["command"]
    assert not any(a.startswith("--speculative-config") for a in services["embed-small"]["command"])
    assert services["coder-dflash7"]["environment"]["VLLM_API_KEY"].startswith(
        "${SPECROUTER_CODER_KEY:?"
    )
    assert "deploy" in dflash and dflash["ipc"] == "host"

    text = (tmp_path / "compose.yaml").read_text()
    # The comment that the two settings go together, and the MTP fallback one line away.
    lines = text.splitlines()
    i = next(
        n for n, line in enumerate(lines) if "--speculative-config" in line and "dflash" in line
    )
    assert "go together" in "\n".join(lines[i - 3 : i])
    assert any(
        re.match(r'\s*# - \'--speculative-config=\{"method": "mtp"', line)
        for line in lines[i + 1 : i + 4]
    )

    gateway = services["gateway"]
    assert "--config=/etc/specrouter/policy/gb10-three.yaml" in gateway["command"]
    assert any(v.endswith(":/etc/specrouter/tls:ro") for v in gateway["volumes"])
    assert "specrouter-state:/var/lib/specrouter" in gateway["volumes"]
    assert gateway["environment"]["SPECROUTER_CODER_KEY"].startswith("${SPECROUTER_CODER_KEY:?")
    dockerfile = tmp_path / gateway["build"]["context"] / gateway["build"]["dockerfile"]
    assert dockerfile.resolve() == (DEPLOY / "Dockerfile").resolve()
    for volume in services["grafana"]["volumes"][:2]:
        assert (tmp_path / volume.split(":")[0]).resolve().is_dir(), volume
    policy_dir = next(v for v in gateway["volumes"] if v.endswith(":/etc/specrouter/policy"))
    assert (tmp_path / policy_dir.split(":")[0] / "gb10-three.yaml").resolve() == THREE.resolve()


def test_rendered_compose_has_the_shipped_single_engine(tmp_path: Path) -> None:
    compose = _render(GB10, tmp_path)
    services = compose["services"]
    assert set(services) == {
        "coder-dflash7",
        "embed-large",
        "embed-small",
        "gateway",
        "prometheus",
        "grafana",
    }
    args = services["coder-dflash7"]["command"]
    assert "--max-model-len=262144" in args and "--scheduling-policy=priority" in args
    # The KV budget at the machine's limit: 71.3 GiB, sixteen 100K contexts (test_kv_budget.py).
    kv = f"--kv-cache-memory-bytes=${{KV_CACHE_BYTES_CODER_DFLASH7:-{72_962 * 1024**2}}}"
    assert kv in args
    machine, line = memory_report(load_policy(GB10))
    assert "margin 3" in machine and "KV at the machine's limit" in machine
    assert "1,609,965 KV tokens" in line and "16 x 100K" in line and "262,144 fits" in line
    spec = _spec(services["coder-dflash7"])
    assert (spec["method"], spec["num_speculative_tokens"]) == ("dflash", 7)
    assert "--config=/etc/specrouter/policy/gb10.yaml" in services["gateway"]["command"]
    # The repair the policy names is defined in the rendered operator file: a restart of the
    # engine's container as compose names it, and the policy validates against that file.
    operator = yaml.safe_load((tmp_path / "operator.yaml").read_text())
    assert operator["actions"]["restart-coder"]["command"] == [
        "docker",
        "restart",
        f"{compose['name']}-coder-dflash7-1",
    ]
    assert load_policy(GB10).backends["coder-dflash7"].repair is not None
    from proxy.operator import load_operator

    context = load_operator(tmp_path / "operator.yaml").context
    assert "restart-coder" in context.actions
    load_policy(GB10, context=context)


def test_a_kv_budget_below_one_request_is_refused(tmp_path: Path) -> None:
    raw = yaml.safe_load(GB10.read_text())
    raw["deployment"]["kv_budget_gib"] = 10  # 262144 tokens need 11.6 GiB with block 7
    with pytest.raises(deploy.DeployError, match="10 GiB KV budget holds less than one"):
        deploy.engine_plans(validate_policy(raw))


def test_the_pair_renders_on_two_gb10s(tmp_path: Path) -> None:
    """As gb10-pair.yaml says: the second engine on the second GB10, the first with the whole
    machine here."""
    raw = yaml.safe_load(PAIR.read_text())
    raw["backends"]["coder-dflash7b"]["url"] = "http://gb10-b:8003"
    policy = tmp_path / "pair2.yaml"
    policy.write_text(yaml.safe_dump(raw))
    compose = _render(policy, tmp_path / "out")
    assert "coder-dflash7b" not in compose["services"] and "coder-dflash7" in compose["services"]
    text = (tmp_path / "out" / "compose.yaml").read_text()
    assert "# Not run here: coder-dflash7b (http://gb10-b:8003 is on another machine)." in text
    _, line = memory_report(load_policy(policy))
    assert "coder-dflash7" in line and "fits" in line
    assert deploy.main(["check", str(policy), str(tmp_path / "out" / "compose.yaml")]) == 0
    from policies.spec.context import ValidationContext

    hosts = frozenset({"127.0.0.1", "gb10-b"})
    # The engine on the other machine gets the secret only where the operator binds it.
    context = ValidationContext(
        secrets=frozenset({"coder-key"}),
        engine_hosts=hosts,
        secret_engines={"coder-key": frozenset({"gb10-b:8003"})},
    )
    load_policy(policy, context=context)


def test_every_compose_variable_is_in_env_example(tmp_path: Path) -> None:
    _render(GB10, tmp_path)
    text = (tmp_path / "compose.yaml").read_text()
    used = set(re.findall(r"\$\{(\w+)", text))
    example = (tmp_path / "env.example").read_text()
    listed = set(re.findall(r"^(\w+)=", example, re.M))
    assert used <= listed, used - listed
    required = set(re.findall(r"\$\{(\w+):\?", text))
    assert {"SPECROUTER_ADMIN_TOKEN", "GRAFANA_ADMIN_PASSWORD", "SPECROUTER_CODER_KEY"} <= required


def test_committed_deploy_files_are_the_render_of_the_gb10_policy() -> None:
    files = deploy.render(load_policy(GB10), policy=GB10, out_dir=DEPLOY)
    for rel, text in files.items():
        assert (DEPLOY / rel).read_text() == text, (
            f"deploy/{rel} is out of date: run `specrouter deploy render policies/gb10.yaml "
            "--out deploy`"
        )
    assert (
        deploy.check_compose(
            load_policy(GB10),
            yaml.safe_load((DEPLOY / "compose.yaml").read_text()),
            compose_dir=DEPLOY,
            policy=GB10,
        )
        == []
    )


def test_rendered_compose_is_valid_for_docker_compose(tmp_path: Path) -> None:
    docker = shutil.which("docker")
    if (
        docker is None
        or subprocess.run(
            [docker, "compose", "version"], capture_output=True, timeout=30
        ).returncode
        != 0
    ):
        pytest.skip("docker compose is not installed")
    _render(GB10, tmp_path)
    env = {
        "SPECROUTER_ADMIN_TOKEN": "t",
        "GRAFANA_ADMIN_PASSWORD": "p",
        "SPECROUTER_CODER_KEY": "k",
        "PATH": "/usr/bin:/bin:/usr/local/bin",
    }
    out = subprocess.run(
        [docker, "compose", "-f", str(tmp_path / "compose.yaml"), "config", "--quiet"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr


def test_promtool_accepts_the_rendered_prometheus_config(tmp_path: Path) -> None:
    if PROMTOOL is None:
        pytest.skip("promtool is installed by `make test` (scripts/system-deps.sh)")
    for policy in (GB10, DEMO):
        out_dir = tmp_path / policy.stem
        _render(policy, out_dir)
        config = out_dir / "prometheus" / "prometheus.yml"
        result = subprocess.run(
            [PROMTOOL, "check", "config", str(config)], capture_output=True, text=True, timeout=30
        )
        assert result.returncode == 0, result.stdout + result.stderr
    scraped = yaml.safe_load((tmp_path / "gb10" / "prometheus" / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in scraped["scrape_configs"]}
    assert jobs["specrouter"]["static_configs"][0]["targets"] == [deploy.METRICS_LISTEN]
    engines = {c["labels"]["backend"]: c["targets"][0] for c in jobs["vllm"]["static_configs"]}
    assert engines["coder-dflash7"] == "127.0.0.1:8001"


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    if SYSTEMD_ANALYZE is None:
        pytest.skip("systemd-analyze is not installed")
    unit = (DEPLOY / "systemd" / "specrouter.service").read_text()
    assert "ExecReload=/bin/kill -HUP $MAINPID" in unit
    assert re.search(r"^Restart=(always|on-failure)$", unit, re.M)
    for option in (
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "PrivateTmp=yes",
        "CapabilityBoundingSet=",
        "StateDirectory=specrouter",
    ):
        assert option in unit
    # verify checks that ExecStart exists: point it at this checkout's entry point.
    entry = Path(sys.executable).parent / "specrouter"
    if not entry.exists():
        pytest.skip("the specrouter entry point is not installed next to this Python")
    copy = tmp_path / "specrouter.service"
    copy.write_text(unit.replace("/opt/specrouter/.venv/bin/specrouter", str(entry)))
    out = subprocess.run(
        [SYSTEMD_ANALYZE, "verify", str(copy)], capture_output=True, text=True, timeout=60
    )
    problems = [
        line
        for line in (out.stdout + out.stderr).splitlines()
        if str(copy) in line or "specrouter.service" in line
    ]
    assert out.returncode == 0 and not problems, out.stdout + out.stderr


def test_systemd_env_example_names_real_settings() -> None:
    from proxy.settings import Settings

    text = (DEPLOY / "systemd" / "specrouter.env.example").read_text()
    names = re.findall(r"^SPECROUTER_(\w+)=", text, re.M)
    fields = {f.upper() for f in Settings.model_fields}
    policy_keys = {secret_env(b.api_key) for b in load_policy(GB10).backends.values() if b.api_key}
    for name in names:
        assert name in fields or f"SPECROUTER_{name}" in policy_keys, name


def test_grafana_provisioning_matches_the_compose_mounts() -> None:
    datasource = yaml.safe_load(
        (DEPLOY / "grafana/provisioning/datasources/prometheus.yaml").read_text()
    )
    ds = datasource["datasources"][0]
    assert ds["type"] == "prometheus" and ds["url"].endswith(deploy.PROMETHEUS_LISTEN)
    provider = yaml.safe_load(
        (DEPLOY / "grafana/provisioning/dashboards/specrouter.yaml").read_text()
    )
    path = provider["providers"][0]["options"]["path"]
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    mounts = {v.split(":")[1]: v.split(":")[0] for v in compose["services"]["grafana"]["volumes"]}
    assert (DEPLOY / mounts[path] / "specrouter.json").is_file()
    assert json.loads((DEPLOY / mounts[path] / "specrouter.json").read_text())["uid"]


# -- render then check --------------------------------------------------------------------------


def _wide_policy() -> dict[str, Any]:
    """Every backend shape: several URLs, a remote engine, an OpenAI backend, priority, keys."""
    return {
        "schema": 1,
        "backends": {
            "big": {
                "urls": ["http://127.0.0.1:9101", "http://localhost:9102"],
                "served_model_name": "big",
                "max_concurrency": 8,
                "engine": {"max_model_len": 32768, "vllm_version": "0.33.0"},
                "api_key": "big-key",
                "priority_scheduling": True,
                "speculative": {
                    "method": "eagle3",
                    "num_speculative_tokens": 4,
                    "num_speculative_tokens_per_batch_size": [[1, 4, 4], [5, 16, 2]],
                },
            },
            "remote": {"url": "http://10.0.0.7:8000", "served_model_name": "big"},
            "cloud": {
                "url": "https://api.example.com",
                "kind": "openai",
                "served_model_name": "big",
            },
            "plain": {
                "url": "http://127.0.0.1:9103",
                "served_model_name": "big",
                "max_concurrency": 4,
                "engine": {"max_model_len": 32768},
            },
            "emb": {"url": "http://127.0.0.1:9104", "task": "embed", "served_model_name": "emb"},
        },
        "routes": {
            "big": {
                "models": ["big"],
                "variants": ["big", "plain", "remote", "cloud"],
                "fallback": "plain",
            },
            "emb": {"models": ["emb"], "task": "embed", "variants": ["emb"]},
        },
    }


@pytest.mark.parametrize("name", ["gb10", "gb10-three", "gb10-pair", "demo", "demo-three", "wide"])
def test_render_then_check_round_trips(tmp_path: Path, name: str) -> None:
    if name == "wide":
        policy = tmp_path / "wide.yaml"
        policy.write_text(yaml.safe_dump(_wide_policy()))
    else:
        policy = THREE if name == "gb10-three" else ROOT / "policies" / f"{name}.yaml"
    out = tmp_path / "out"
    compose = _render(policy, out)
    doc = load_policy(policy)
    assert deploy.check_compose(doc, compose, compose_dir=out, policy=policy) == []
    assert deploy.main(["check", str(policy), str(out / "compose.yaml")]) == 0


def test_wide_policy_renders_what_runs_here(tmp_path: Path) -> None:
    policy = tmp_path / "wide.yaml"
    policy.write_text(yaml.safe_dump(_wide_policy()))
    compose = _render(policy, tmp_path / "out")
    services = compose["services"]
    assert {"big-1", "big-2", "plain", "emb"} <= set(services)
    assert "remote" not in services and "cloud" not in services
    text = (tmp_path / "out" / "compose.yaml").read_text()
    assert "# Not run here: remote (http://10.0.0.7:8000 is on another machine)." in text
    big = services["big-2"]["command"]
    assert "--port=9102" in big and "--scheduling-policy=priority" in big
    assert _spec(services["big-1"])["num_speculative_tokens_per_batch_size"] == [
        [1, 4, 4],
        [5, 16, 2],
    ]
    assert services["big-1"]["labels"][deploy.BACKEND_LABEL] == "big"
    assert services["big-1"]["environment"]["VLLM_API_KEY"].startswith("${SPECROUTER_BIG_KEY:?")


def test_port_clash_is_refused() -> None:
    raw = _wide_policy()
    raw["backends"]["plain"]["url"] = "http://127.0.0.1:9101"
    with pytest.raises(deploy.DeployError, match="both listen on port 9101"):
        deploy.engine_plans(validate_policy(raw))


def _scheduled(version: str, method: str) -> dict[str, Any]:
    raw = _wide_policy()
    big = raw["backends"]["big"]
    big["engine"]["vllm_version"] = version
    big["speculative"]["method"] = method
    return raw


# (release, method, honoured): read from each release's wheel (deploy/README.md, "Draft schedules")
SCHEDULES = [
    ("0.28.0", "dflash", True),
    ("0.28.0", "mtp", True),
    ("0.28.0", "suffix", True),
    ("0.28.0", "custom_class", False),
    ("0.32.0", "custom_class", False),
    ("0.33.0", "dflash", True),
    ("0.33.0", "mtp", True),
    ("0.33.0", "suffix", False),
    ("0.33.0", "medusa", False),
]


@pytest.mark.parametrize(("version", "method", "honoured"), SCHEDULES)
def test_schedule_rendered_only_where_the_release_honours_it(
    tmp_path: Path, version: str, method: str, honoured: bool
) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(yaml.safe_dump(_scheduled(version, method)))
    if honoured:
        compose = _render(policy, tmp_path / "out")
        schedule = _spec(compose["services"]["big-1"])["num_speculative_tokens_per_batch_size"]
        assert schedule == [[1, 4, 4], [5, 16, 2]]
        return
    with pytest.raises(deploy.DeployError, match=f"vLLM {version} ignores .* method {method}"):
        for plan in deploy.engine_plans(load_policy(policy))[0]:
            deploy.engine_command(plan)
    assert deploy.main(["render", str(policy), "--out", str(tmp_path / "out")]) != 0


@pytest.mark.parametrize(("version", "method", "honoured"), SCHEDULES)
def test_check_refuses_a_schedule_the_release_ignores(
    tmp_path: Path, version: str, method: str, honoured: bool
) -> None:
    # The compose file states the schedule, as if written by hand: rendered with a method the
    # release honours, then edited to the method under test.
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(yaml.safe_dump(_scheduled(version, "eagle3")))
    _render(rendered, tmp_path / "out")
    text = (tmp_path / "out" / "compose.yaml").read_text()
    compose = yaml.safe_load(text.replace('"eagle3"', f'"{method}"'))
    policy = tmp_path / "p.yaml"
    policy.write_text(yaml.safe_dump(_scheduled(version, method)))
    lines = deploy.check_compose(load_policy(policy), compose)
    refused = [line for line in lines if "ignores num_speculative_tokens_per_batch_size" in line]
    assert bool(refused) is not honoured, lines
    # The edited method also changes the memory split (no drafter for mtp): that is reported too.
    other = [line for line in lines if line not in refused and "its KV budget is" not in line]
    assert other == [], lines


def test_schedule_on_an_unchecked_release_is_refused() -> None:
    reason = deploy_schedule.refusal("0.27.0", "dflash")
    assert reason is not None and "not known to have" in reason
    assert deploy_schedule.refusal("0.28.0", "dflash") is None


# -- a hand-edited compose file -----------------------------------------------------------------


def _edit(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


EDITS: list[tuple[str, str, str, str]] = [
    (
        '"num_speculative_tokens": 7',
        '"num_speculative_tokens": 5',
        "speculative num_speculative_tokens is 5 in the compose file, 7 in the policy",
        "drafter at 5",
    ),
    (
        '"rejection_sample_method": "block"',
        '"rejection_sample_method": "standard"',
        'speculative rejection_sample_method is "standard" in the compose file, "block"',
        "verification changed alone",
    ),
    (
        "--max-num-seqs=16",
        "--max-num-seqs=32",
        "--max-num-seqs is '32' in the compose file, '16' in the policy",
        "concurrency",
    ),
    (
        "--served-model-name=qwen3.8-27b",
        "--served-model-name=qwen",
        "--served-model-name is 'qwen'",
        "served name",
    ),
    ("--port=8002", "--port=8003", "--port is '8003' in the compose file, '8002'", "port"),
    (
        "      - --enable-request-id-headers\n",
        "      - --enable-request-id-headers\n      - --per-request-spec-decode-metrics=summary\n",
        "--per-request-spec-decode-metrics is not a flag of vLLM 0.28.0",
        "a 0.29 flag on 0.28",
    ),
    (
        "--max-model-len=131072",
        "--max-model-len=262144",
        "less than one --max-model-len 262,144 request: vLLM refuses to start it",
        "context too long",
    ),
    (
        "${KV_CACHE_BYTES_CODER_DFLASH5:-",
        "${KV_CACHE_BYTES_CODER_DFLASH5:-1",
        "the engines take",
        "KV budget over the machine",
    ),
    ("      - --enable-auto-tool-choice\n", "", "no --enable-auto-tool-choice", "no tool choice"),
    (
        "image: ${VLLM_IMAGE:-vllm/vllm-openai:v0.28.0}",
        "image: vllm/vllm-openai:v0.33.0",
        "runs vLLM 0.33.0, the policy says 0.28.0",
        "another release",
    ),
    (
        """      - '--speculative-config={"method": "mtp", "num_speculative_tokens": 3}'""",
        "      - --enforce-eager",
        "the engine has no --speculative-config",
        "speculation removed",
    ),
    (
        "      - --runner=pooling\n",
        "      - --runner=pooling\n"
        """      - '--speculative-config={"method": "ngram", "num_speculative_tokens": 2}'\n""",
        "the engine speculates",
        "speculation added",
    ),
    (
        '"draft_sample_method": "probabilistic", ',
        '"draft_sample_method": "probabilistic", "draft_tensor_parallel_size": 1, ',
        "speculative draft_tensor_parallel_size = 1 is not in the policy",
        "unknown field",
    ),
    (
        "io.specrouter.backend: embed-large",
        "io.specrouter.backend: embed-huge",
        "labelled backend 'embed-huge'",
        "relabelled",
    ),
]


@pytest.mark.parametrize(
    ("old", "new", "message"), [e[:3] for e in EDITS], ids=[e[3] for e in EDITS]
)
def test_a_hand_edit_is_reported(tmp_path: Path, old: str, new: str, message: str) -> None:
    _render(THREE, tmp_path)
    path = tmp_path / "compose.yaml"
    path.write_text(_edit(path.read_text(), old, new))
    diffs = deploy.check_compose(load_policy(THREE), yaml.safe_load(path.read_text()))
    assert any(message in d for d in diffs), diffs
    assert deploy.main(["check", str(THREE), str(path)]) == 1


def test_check_lists_every_difference_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _render(THREE, tmp_path)
    path = tmp_path / "compose.yaml"
    text = _edit(path.read_text(), '"num_speculative_tokens": 7', '"num_speculative_tokens": 5')
    text = _edit(text, "--max-num-seqs=64", "--max-num-seqs=8")
    compose = yaml.safe_load(text)
    del compose["services"]["embed-small"]
    compose["services"]["coder-extra"] = {
        "image": "vllm",
        "entrypoint": ["vllm", "serve"],
        "command": ["/models/x", "--port=8099"],
    }
    path.write_text(yaml.safe_dump(compose))
    assert deploy.main(["check", str(THREE), str(path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert any("num_speculative_tokens is 5" in line for line in out)
    assert any("embed-large" in line and "--max-num-seqs is '8'" in line for line in out)
    assert any(line.startswith("backend embed-small: no engine service") for line in out)
    assert any(
        line.startswith("service coder-extra: a vLLM engine that no backend") for line in out
    )


def test_check_notices_the_gateway_serving_another_policy(tmp_path: Path) -> None:
    compose = _render(GB10, tmp_path)
    diffs = deploy.check_compose(load_policy(GB10), compose, compose_dir=tmp_path, policy=DEMO)
    # demo.yaml's engines differ (ports) and the gateway serves gb10.yaml, not demo.yaml.
    assert any("the gateway serves" in d and "gb10.yaml" in d for d in diffs), diffs


def test_check_reads_string_commands_and_the_api_server_module() -> None:
    doc = load_policy(THREE)
    compose = {
        "services": {
            "coder-mtp3": {
                "command": "python3 -m vllm.entrypoints.openai.api_server --model /m "
                "--served_model_name qwen3.8-27b --port 8002 --max-num-seqs 16 "
                '--speculative-config \'{"method": "mtp", "num_speculative_tokens": 3}\' '
                "--max_model_len 131072 --gpu-memory-utilization 0.26 "
                "--enable-auto-tool-choice --tool-call-parser qwen3_coder "
                "--reasoning-parser=qwen3 --enforce-eager",
                "environment": ["VLLM_API_KEY=x"],
            }
        }
    }
    engines = deploy.compose_engines(compose)
    assert engines["coder-mtp3"].model == "/m"
    assert engines["coder-mtp3"].flags["enforce-eager"] is None
    diffs = deploy.check_compose(doc, compose)
    assert not any("coder-mtp3" in d for d in diffs if not d.startswith("backend ")), diffs
    assert {d.split(":")[0] for d in diffs} == {
        "backend coder-dflash7",
        "backend coder-dflash5",
        "backend embed-large",
        "backend embed-small",
    }


def test_cli_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema: 1\nbackends: {}\n")
    assert deploy.main(["render", str(bad)]) == 2
    assert "invalid policy" in capsys.readouterr().err
    assert deploy.main(["check", str(GB10), str(tmp_path / "missing.yaml")]) == 2
    assert deploy.main(["render", str(GB10)]) == 0
    assert capsys.readouterr().out.startswith("# The GB10 stack")


# -- the running engines (--live) ---------------------------------------------------------------


def test_check_live_with_canned_answers() -> None:
    doc = load_policy(THREE)
    per_pos = "\n".join(
        f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}} 0.0'
        for i in range(5)
    )
    answers = {
        "http://127.0.0.1:8001/v1/models": '{"data": [{"id": "qwen3.8-27b"}]}',
        "http://127.0.0.1:8001/metrics": "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos "
        "counter\n" + per_pos + "\n",
        "http://127.0.0.1:8002/v1/models": '{"data": [{"id": "qwen"}]}',
        "http://127.0.0.1:8003/v1/models": '{"data": [{"id": "qwen3.8-27b"}]}',
        "http://127.0.0.1:8003/metrics": "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos "
        "counter\n" + per_pos + "\n",
        "http://127.0.0.1:8011/v1/models": '{"data": [{"id": "embedding-large"}]}',
        "http://127.0.0.1:8012/v1/models": '{"data": [{"id": "embedding-small"}]}',
    }
    seen: list[tuple[str, dict[str, str]]] = []

    def fetch(url: str, headers: Any) -> str | None:
        seen.append((url, dict(headers)))
        return answers.get(url)

    diffs = deploy.check_live(doc, fetch, env={"SPECROUTER_CODER_KEY": "k"})
    assert diffs == [
        "backend coder-dflash7 at http://127.0.0.1:8001: the engine drafts 5 positions, the "
        "policy says num_speculative_tokens 7",
        "backend coder-mtp3 at http://127.0.0.1:8002: serves ['qwen'], not 'qwen3.8-27b'",
    ]
    assert ("http://127.0.0.1:8001/v1/models", {"authorization": "Bearer k"}) in seen
    answers.pop("http://127.0.0.1:8011/v1/models")
    assert any(
        "embed-large" in d and "not reachable" in d for d in deploy.check_live(doc, fetch, env={})
    )


def test_check_live_against_simulated_engines(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from loadtests.harness.sim import SimServer

    with (
        SimServer(
            "dflash7-prob-block", served_model_name="qwen3.8-27b", spec_metrics="summary"
        ) as dflash,
        SimServer("mtp3", served_model_name="qwen3.8-27b", spec_metrics="none") as mtp,
    ):
        raw = yaml.safe_load(THREE.read_text())
        raw["deployment"]["vllm_version"] = "0.29.0"  # has the per-request spec summary
        raw["backends"]["coder-dflash7"]["url"] = dflash.url
        raw["backends"]["coder-mtp3"]["url"] = mtp.url
        del raw["backends"]["coder-dflash5"]
        raw["routes"]["coder"]["variants"].remove("coder-dflash5")
        raw["routes"]["coder"]["rules"][-1]["otherwise"] = "coder-mtp3"
        for name in ("embed-large", "embed-small"):
            del raw["backends"][name], raw["routes"][name]
        policy = tmp_path / "live.yaml"
        policy.write_text(yaml.safe_dump(raw))
        diffs = deploy.check_live(load_policy(policy), deploy.http_fetch(), env={})
        # The MTP engine runs without per-request metrics: the only difference.
        assert len(diffs) == 1 and "coder-mtp3" in diffs[0], diffs
        assert "--per-request-spec-decode-metrics is 'none'" in diffs[0]

        raw["backends"]["coder-dflash7"]["speculative"]["num_speculative_tokens"] = 5
        raw["backends"]["coder-dflash7"]["max_concurrency"] = 8
        policy.write_text(yaml.safe_dump(raw))
        assert deploy.main(["check", str(policy), "--live"]) == 1
        out = capsys.readouterr().out
        assert "the engine drafts 7 positions, the policy says num_speculative_tokens 5" in out
        assert "speculative num_speculative_tokens is 7 on the engine, 5 in the policy" in out
        assert "max_num_seqs is 16 on the engine, max_concurrency 8 in the policy" in out
