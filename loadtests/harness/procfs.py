"""What a local process costs and holds, from /proc (Linux): RSS, CPU times, fds, TCP sockets.

Every figure is read from the kernel's own accounting, so a benchmark or a test measures the
gateway (or nginx, or the simulator) without asking it anything.
"""

from __future__ import annotations

import contextlib
import os
import resource
from collections.abc import Iterable, Sequence
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")

_TCP_STATES = {
    "01": "ESTABLISHED",
    "02": "SYN_SENT",
    "04": "FIN_WAIT1",
    "05": "FIN_WAIT2",
    "06": "TIME_WAIT",
    "07": "CLOSE",
    "08": "CLOSE_WAIT",
    "09": "LAST_ACK",
    "0A": "LISTEN",
    "0B": "CLOSING",
}


def _stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat after the command name (which may hold spaces and parentheses)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rfind(")") + 2 :].split()


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def rss_bytes(pids: Sequence[int]) -> int:
    """Resident memory of the processes together; one that is gone counts 0."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += rss_kb(pid) * 1024
    return total


def cpu_split(pids: Sequence[int]) -> tuple[float, float]:
    """(utime, stime) of the processes (all their threads), in seconds."""
    user = system = 0
    for pid in pids:
        try:
            fields = _stat_fields(pid)
        except OSError:
            continue
        user += int(fields[11])  # field 14 of proc(5)
        system += int(fields[12])  # field 15
    return user / CLK_TCK, system / CLK_TCK


def cpu_ns(pids: Sequence[int]) -> int:
    """Time on a CPU of the processes' live threads, in ns (/proc/PID/task/TID/schedstat):
    the scheduler's own clock, where utime and stime count 10 ms ticks, too coarse for a round
    of a few requests."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    total += int((task / "schedstat").read_text().split()[0])
    return total


def cpu_seconds(pids: int | Sequence[int]) -> float:
    """utime + stime of the process(es) (all their threads), in seconds."""
    return sum(cpu_split([pids] if isinstance(pids, int) else pids))


def self_cpu() -> float:
    """This process's own CPU seconds (user + system)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def child_pids(pid: int) -> list[int]:
    """Direct children of `pid` (nginx workers)."""
    out: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = _stat_fields(int(entry))
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(entry))
    return out


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def socket_inodes(pid: int) -> set[int]:
    out: set[int] = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in os.listdir(fd_dir):
        with contextlib.suppress(OSError):
            target = os.readlink(fd_dir / fd)
            if target.startswith("socket:["):
                out.add(int(target[8:-1]))
    return out


def tcp_sockets(pid: int) -> list[tuple[int, int, str]]:
    """(local port, remote port, state) of every TCP socket the process holds open."""
    inodes = socket_inodes(pid)
    out: list[tuple[int, int, str]] = []
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
            for line in lines:
                f = line.split()
                if int(f[9]) not in inodes:
                    continue
                local, remote = f[1].rsplit(":", 1)[1], f[2].rsplit(":", 1)[1]
                out.append((int(local, 16), int(remote, 16), _TCP_STATES.get(f[3], f[3])))
    return out


def upstream_conns(pid: int, ports: Iterable[int]) -> dict[int, dict[str, int]]:
    """The process's TCP connections to each of `ports`, by state."""
    wanted = set(ports)
    out: dict[int, dict[str, int]] = {p: {} for p in wanted}
    for _, remote, state in tcp_sockets(pid):
        if remote in wanted:
            out[remote][state] = out[remote].get(state, 0) + 1
    return out
