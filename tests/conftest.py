from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from loadtests.harness.ports import free_port
from proxy.certs import CertFiles, make_local_ca
from tests import lanes
from tests.engines import boot
from tests.redis_server import redis_server
from tests.stacks import Stacks


def pytest_configure(config: pytest.Config) -> None:
    lanes.settle()
    if config.pluginmanager.hasplugin("xdist"):  # `-p no:xdist` knows no scheduler hook
        config.pluginmanager.register(lanes.Scheduler(boot.FOLDERS), "lanes")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    boot.reorder(items)  # the real-vLLM folders that boot last run last


def pytest_collection_finish(session: pytest.Session) -> None:
    if not session.config.option.collectonly and lanes.worker() == lanes.FIRST_WORKER:
        boot.boot_for(session.items)  # the real-vLLM engines boot while other tests run


def pytest_sessionfinish() -> None:
    boot.BOOT.close()


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
    with redis_server(free_port(), tmp_path) as url:
        yield url


@pytest.fixture(scope="module")
def stacks() -> Iterator[Stacks]:
    """Servers shared by this module's tests, one per configuration key (tests/stacks.py)."""
    pool = Stacks()
    try:
        yield pool
    finally:
        pool.close()
