"""The Kubernetes manifests parse, and the policy they carry is a valid policy."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from policies.compiled import compile_policy
from policies.schema import parse_policy

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"


def _docs() -> list[dict]:
    return [d for p in sorted(K8S.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]


def test_manifests_have_the_expected_kinds() -> None:
    kinds = sorted(d["kind"] for d in _docs())
    assert kinds == [
        "ConfigMap",
        "Deployment",
        "Secret",
        "Secret",
        "Service",
        "Service",
        "ServiceMonitor",
    ]
    api = {
        "ConfigMap": "v1",
        "Secret": "v1",
        "Service": "v1",
        "Deployment": "apps/v1",
        "ServiceMonitor": "monitoring.coreos.com/v1",
    }
    names = [(d["kind"], d["metadata"]["name"]) for d in _docs()]
    assert len(set(names)) == len(names)  # no two objects of one kind share a name
    for d in _docs():
        assert d["apiVersion"] == api[d["kind"]], d["kind"]
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", d["metadata"]["name"])


def test_configmap_policy_is_valid_and_the_deployment_mounts_it() -> None:
    docs = _docs()
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    policy = compile_policy(parse_policy(cm["data"]["policy.yaml"]))
    assert len(policy.backend("coder-dflash7").engine_urls) == 2
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    assert spec["volumes"][0]["configMap"]["name"] == cm["metadata"]["name"]
    args = spec["containers"][0]["args"]
    assert "--config=/etc/specrouter/policy.yaml" in args
    drain = int(next(a for a in args if a.startswith("--drain-timeout=")).split("=")[1])
    assert spec["terminationGracePeriodSeconds"] > drain
