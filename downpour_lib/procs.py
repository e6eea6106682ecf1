"""Processes by id from /proc: alive or not, their trees, and stopping them (TERM, then KILL)
without ever signalling this process or its ancestors. The Slurm sandbox's daemons and jobs, and
a cluster's controller with the schedulers it started (``cluster.processes``). Stdlib only."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path


def proc_state(pid: int) -> tuple[int, str] | None:
    """(parent pid, state letter) of a live process, None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # the name may hold spaces and parentheses
    return int(fields[1]), fields[0]


def alive(pid: int | None) -> bool:
    state = proc_state(pid) if pid else None
    return state is not None and state[1] not in ("Z", "X")  # a zombie runs nothing


def environ_has(pid: int, entry: bytes) -> bool:
    try:
        return entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            state = proc_state(int(entry.name))
            if state is not None:
                children.setdefault(state[0], []).append(int(entry.name))
    return children


def descendants(roots: Iterable[int]) -> list[int]:
    children, out, todo = children_map(), [], list(roots)
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def in_session(sid: int) -> list[int]:
    """The live processes of session ``sid`` (``setsid``'s, as a process started with
    ``start_new_session`` leads one): what it started, however late, also once it is gone."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()  # state, ppid, pgrp, session, ...
            if int(fields[3]) == sid and fields[0] not in ("Z", "X"):
                found.append(int(entry.name))
    return found


def protected() -> set[int]:
    """This process and its ancestors: never signalled, whatever their environment says."""
    pids, pid = {1}, os.getpid()
    while pid > 1:
        pids.add(pid)
        state = proc_state(pid)
        pid = state[0] if state else 1
    return pids


def terminate(pids: Iterable[int], timeout_s: float) -> None:
    """SIGTERM, wait, then SIGKILL what is still alive."""
    pids = [p for p in dict.fromkeys(pids) if p not in protected() and alive(p)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(alive(p) for p in pids):
            time.sleep(0.1)
        pids = [p for p in pids if alive(p)]
        if not pids:
            return


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""
