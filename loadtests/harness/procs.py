"""Simulated engines and a gateway as subprocesses on loopback, for the policy sweep and tests.

`SimProc("mtp3", time_scale=0.05)` runs `specrouter sim --port 0` and reads the line it prints
once it accepts connections; `GatewayProc(policy_dict, workdir)` runs `specrouter serve` with a
local CA (TLS, as in production) and an admin token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from loadtests.harness.launch import SERVE_READY, SIM_READY, Child, cli, serve_args, sim_args
from proxy.certs import make_local_ca

ADMIN_TOKEN = "probe-admin-token-of-thirty-two-chars"  # 32+: the gateway refuses less


class SimProc:
    def __init__(
        self,
        profile: str,
        *,
        time_scale: float,
        seed: int = 0,
        served_model_name: str | None = None,
        max_num_seqs: int = 16,
    ) -> None:
        self.profile = profile
        self.child = Child(
            f"specrouter sim {profile}",
            cli(
                "sim",
                *sim_args(
                    profile,
                    time_scale=time_scale,
                    seed=seed,
                    max_num_seqs=max_num_seqs,
                    served_model_name=served_model_name,
                ),
            ),
            ready=SIM_READY,
            stderr=False,
        ).start()
        assert self.child.match is not None and self.child.proc is not None
        self.proc = self.child.proc
        self.url = self.child.match.group(1)

    def close(self) -> None:
        self.child.stop()

    def __enter__(self) -> SimProc:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class GatewayProc:
    """`specrouter serve` on loopback ports with TLS from a local CA in `workdir`."""

    def __init__(
        self, policy: dict[str, Any], workdir: Path, *, scrape_interval_s: float = 0.5
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.certs = make_local_ca(workdir / "tls")
        self.policy_path = workdir / "policy.yaml"
        self.policy_path.write_text(yaml.safe_dump(policy, sort_keys=False), encoding="utf-8")
        args = serve_args(
            self.policy_path,
            workdir / "state",
            ADMIN_TOKEN,
            certs=self.certs,
            scrape_interval_s=scrape_interval_s,
        )
        self.child = Child("gateway", cli("serve", *args), ready=SERVE_READY).start()
        assert self.child.match is not None and self.child.proc is not None
        self.proc = self.child.proc
        self.output = self.child.output
        self.base, self.admin = self.child.match.group(1), self.child.match.group(2)

    @property
    def ca_cert(self) -> Path:
        return self.certs.ca_cert

    def close(self) -> None:
        self.child.stop()

    def __enter__(self) -> GatewayProc:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
