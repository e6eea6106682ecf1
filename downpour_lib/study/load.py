"""How busy the machine was while a study measured a run, recorded in the run's row.

A shared machine (a laptop in use, a login node, a KVM guest beside others) slows a run's ranks by
as much as other processes take of its cores: on a 2-core machine with load 4-16, repeats of one
point spread 7-36% against 0.1-8% on a quiet one. ``LoadProbe`` wraps one run and records:

- ``load_avg_1m_start``, ``load_avg_1m_end``: the kernel's 1-minute load average (it counts the run's
  own ranks too, so it says how crowded the machine was, not who crowded it);
- ``load_others_cpu_s``: CPU seconds the machine spent on anything but the run while it ran: busy
  time of every core (``/proc/stat``: user, nice, system, irq, softirq and steal, which is time a
  hypervisor gave other guests) minus the CPU time of the run's own processes (this process, its
  descendants, and the ``pids`` a launcher names, e.g. a cluster's engines on this machine, the
  Slurm sandbox's nodes included: ``ClusterSession.local_pids``);
- ``load_others_share``: that as a share of the machine's cores over the run, and ``under_load``:
  True where it reached ``LOADED_SHARE``. The figures mark such points and ``make study`` says so.

Where ``/proc/stat`` is missing (not Linux) the columns are NaN and no run is flagged.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from typing import Any

#: A run counts as measured under load when other processes took at least this share of the
#: machine's cores while it ran. An idle machine's daemons and this study's own notebook kernel
#: take 1-3% of 2 cores; 10% (a fifth of a core on 2 cores) already moves a point by more than the
#: 1% standard error of its 10 measured steps.
LOADED_SHARE = 0.10

#: /proc/stat counts in ticks of 10 ms per core: over a shorter run the share is noise (a
#: 3 ms run read 107% of 2 cores), so it is left NaN and the run is not flagged.
MIN_WINDOW_S = 1.0

COLUMNS = ("load_avg_1m_start", "load_avg_1m_end", "load_window_s", "load_others_cpu_s",
           "load_others_share", "under_load")


def machine_busy_s() -> float | None:
    """CPU seconds every core of the machine has been busy since boot (``/proc/stat``'s first line:
    user, nice, system, irq, softirq, steal; guest time is inside user), None where unreadable."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(x) for x in fields[1:9]] + [0] * max(0, 9 - len(fields))
    user, nice, system, _idle, _iowait, irq, softirq, steal = ticks[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def load_average() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def own_cpu_s(pids: Iterable[int] = ()) -> dict[int, float]:
    """pid -> CPU seconds (user + system, and its children's that it has reaped) of this process,
    its descendants, and ``pids`` with their descendants."""
    import psutil

    seen: dict[int, float] = {}
    roots = [os.getpid(), *pids]
    for pid in roots:
        try:
            root = psutil.Process(pid)
            family = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for p in family:
            if p.pid in seen:
                continue
            try:
                t = p.cpu_times()
            except psutil.Error:
                continue
            seen[p.pid] = t.user + t.system + t.children_user + t.children_system
    return seen


class LoadProbe:
    """``with LoadProbe(pids) as probe: run()``, then ``probe.columns()`` for the run's row.
    ``pids``: called at the start and the end, the processes of the run that are not this
    process's descendants (e.g. the engines of a cluster another process started)."""

    def __init__(self, pids: Callable[[], Iterable[int]] | None = None,
                 cores: int | None = None) -> None:
        self._pids = pids or (lambda: ())
        self.cores = cores or os.cpu_count() or 1  # /proc/stat counts every core of the machine
        self._start: tuple[float, float | None, float, dict[int, float]] | None = None
        self._columns: dict[str, Any] = {}
        self.own_cpu_s = float("nan")

    def __enter__(self) -> LoadProbe:
        own = own_cpu_s(self._pids())
        self._start = (time.monotonic(), machine_busy_s(), load_average(), own)
        return self

    def __exit__(self, *exc) -> None:
        t0, busy0, load0, own0 = self._start
        own1 = own_cpu_s(self._pids())
        busy1, window = machine_busy_s(), time.monotonic() - t0
        # a process there at the start counts from then; one born during the run, all of it
        own = sum(max(0.0, cpu - own0.get(pid, 0.0)) for pid, cpu in own1.items())
        self.own_cpu_s = own  # the run's own processes' CPU seconds (not a column: a check's)
        others = share = float("nan")
        if busy0 is not None and busy1 is not None and window >= MIN_WINDOW_S:
            others = max(0.0, busy1 - busy0 - own)
            share = others / (window * self.cores)
        self._columns = {
            "load_avg_1m_start": round(load0, 2), "load_avg_1m_end": round(load_average(), 2),
            "load_window_s": round(window, 2), "load_others_cpu_s": round(others, 2),
            "load_others_share": round(share, 3),
            "under_load": bool(share >= LOADED_SHARE),  # NaN compares False: not flagged
        }

    def columns(self) -> dict[str, Any]:
        return dict(self._columns)


def describe(columns: dict[str, Any], cores: int | None = None) -> str:
    """'under load: other processes took 35% of 2 cores, load average 4.2' for a run's log line."""
    cores = cores or os.cpu_count() or 1
    return (f"under load: other processes took {columns['load_others_share']:.0%} of {cores} "
            f"cores, load average {columns['load_avg_1m_end']:.1f}")
