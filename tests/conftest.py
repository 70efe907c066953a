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
