"""The workers' lanes (tests/lanes.py), driven as pytest-xdist's controller drives them: nodes
added, collections registered, tests reported done one by one, until every node is shut down."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from tests import lanes

FOLDERS = ("tests/engines/vllm", "tests/engines/vllm_kv")
TIMED = lanes.TIMED[:2]
COLLECTION = [
    "tests/a/test_one.py::test_x",
    "tests/a/test_one.py::test_y[1]",
    "tests/a/test_one.py::test_y[2]",
    f"{TIMED[0]}::test_t",
    "tests/engines/vllm/test_e.py::test_e1",
    "tests/b/test_two.py::Case::test_z",
    "tests/engines/vllm_kv/test_k.py::test_k",
    f"{TIMED[1]}::test_u",
    "tests/b/test_three.py::test_w",
    "tests/engines/vllm/test_e.py::test_e2",
]


@dataclass(eq=False)
class Node:
    """What the scheduler reads and calls of xdist's WorkerController."""

    name: str
    sent: list[str] = field(default_factory=list)
    shutting_down: bool = False

    @property
    def gateway(self) -> Any:
        return SimpleNamespace(id=self.name)

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent += [COLLECTION[i] for i in indices]

    def shutdown(self) -> None:
        self.shutting_down = True


def _run(names: list[str], *, gone: str | None = None) -> dict[str, Node]:
    """Every test run to the end, each node finishing its oldest test first, in turn; as an
    xdist worker does, a node runs the last test it was sent only once it is sent another or
    told to shut down (it passes the next test to the hooks of the one it runs)."""
    config: Any = SimpleNamespace(
        getvalue=lambda name: [f"{len(names)}*popen"],
        option=SimpleNamespace(loadscopereorder=True),
    )
    sched = lanes.Lanes(config, engine_folders=FOLDERS)
    world: dict[str, Node] = {}
    done: dict[str, int] = dict.fromkeys(names, 0)
    for name in names:
        world[name] = node = Node(name)
        sched.add_node(node)  # type: ignore[arg-type]
        sched.add_node_collection(node, COLLECTION)  # type: ignore[arg-type]
    if gone is not None:  # a worker that died before it ran anything
        sched.remove_node(world.pop(gone))  # type: ignore[arg-type]
    sched.schedule()
    while not sched.tests_finished:
        moved = False
        for name, node in world.items():
            if done[name] < len(node.sent) - (not node.shutting_down):
                done[name] += 1
                sched.mark_test_complete(node, COLLECTION.index(node.sent[done[name] - 1]))  # type: ignore[arg-type]
                moved = True
        assert moved, "work left that no node was given"
    assert all(node.shutting_down for node in world.values())
    assert sorted(n for node in world.values() for n in node.sent) == sorted(COLLECTION)
    return world


def _modules(sent: list[str]) -> list[str]:
    return list(dict.fromkeys(lanes.unit_of(n, FOLDERS) for n in sent))


# Which node xdist adds first is a race; with more nodes than units it shuts the last ones down.
@pytest.mark.parametrize(
    "names",
    [
        ["gw0", "gw1", "gw2"],
        ["gw2", "gw1", "gw0"],
        ["gw0"],
        [*(f"gw{i}" for i in range(1, 10)), "gw0"],
    ],
)
def test_gw0_runs_the_timed_modules_then_the_engines_and_the_others_the_rest(
    names: list[str],
) -> None:
    world = _run(names)
    units = _modules(world["gw0"].sent)
    assert units[: len(TIMED) + 1] == [*TIMED, lanes.ENGINES]
    for name in set(names) - {"gw0"}:
        assert not set(_modules(world[name].sent)) & {*TIMED, lanes.ENGINES}, name


def test_without_gw0_another_worker_takes_its_lane() -> None:
    world = _run(["gw0", "gw1", "gw2"], gone="gw0")
    holder = next(n for n in world.values() if lanes.ENGINES in _modules(n.sent))
    assert _modules(holder.sent)[: len(TIMED) + 1] == [*TIMED, lanes.ENGINES]


@pytest.mark.parametrize(
    ("nodeid", "unit"),
    [
        ("tests/engines/vllm/test_e.py::test_e1", lanes.ENGINES),
        ("tests/engines/vllm_kv/test_k.py::test_k[a::b]", lanes.ENGINES),
        ("tests/engines/vllm_other.py::test_o", "tests/engines/vllm_other.py"),
        ("tests/b/test_two.py::Case::test_z", "tests/b/test_two.py"),
    ],
)
def test_a_unit_is_a_module_or_the_engines_folders(nodeid: str, unit: str) -> None:
    assert lanes.unit_of(nodeid, FOLDERS) == unit
