from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.certs import CertFiles, make_local_ca


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertFiles:
    return make_local_ca(Path(tmp_path_factory.mktemp("tls")))


@pytest.fixture(scope="session")
def artifacts() -> Iterator[Path]:
    path = Path(__file__).resolve().parent.parent / "test-artifacts"
    path.mkdir(exist_ok=True)
    yield path


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    """A real redis-server on a free loopback port, in a temp dir, stopped afterwards."""
    import shutil
    import socket
    import subprocess
    import time

    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server missing: `make test` installs it (scripts/system-deps.sh)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp_path),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
