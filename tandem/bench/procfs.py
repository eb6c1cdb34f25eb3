"""What /proc says of processes (Linux): their children and their CPU time, for benchmarks that
account for every process of a server, its forks included."""

import os
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str]:
    """/proc/<pid>/stat after the command name (which may hold spaces and parentheses)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2:].split()


def command_line(pid: int) -> str:
    """The command line, or the comm name where it is empty; '' once the process is gone."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        return cmdline or Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def children_map() -> dict[int, list[int]]:
    """Every live process's children, by parent pid, from one pass over /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                ppid = int(_stat_fields(int(entry.name))[1])
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile
            children.setdefault(ppid, []).append(int(entry.name))
    return children


def descendants(pid: int) -> list[int]:
    """pid's children, their children, and so on (not pid itself)."""
    tree, found, todo = children_map(), [], [pid]
    while todo:
        kids = tree.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a live process (all its threads); None once it is gone."""
    try:
        fields = _stat_fields(pid)
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime
