"""The emulated sweep on the multi-node Slurm sandbox: 4 ranks a host, links shaped between hosts.

Notebook 02's emulated sweep (``studies.run_emulated_sweep``) runs here when this process can make
the sandbox (root, Slurm, ``ip netns``): every run is one ``srun`` of ``downpour train`` across
``ceil(world_size / 4)`` of its hosts, in blocks of ``RANKS_PER_NODE`` consecutive ranks (a 33-rank
sync_ps: its server and workers 1-3 on node1, ..., worker 32 alone on node9), so that ranks of a
host talk inside it and the shaped link is each host's network card, as on a cluster of 4-GPU
nodes. The sweep runs once per link rate; each run's row says where it ran (``where``: ``sandbox
1gbit``), which is part of its identity, so the same config at two rates are two runs and two
series (``core.with_series``), never mixed.

Ranks sleep their compute (``--compute emulated``), so 33 of them fit on this machine's 2 cores;
the sandbox's hosts share those cores and this machine's memory (about 0.5 GB a training rank).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import TrainConfig
from ..errors import ConfigError
from .core import StudyError
from .on_sandbox import SandboxUse

#: Ranks a sandbox host runs: a 4-GPU node's workers (32 workers: 8 hosts, plus a server's rank).
RANKS_PER_NODE = 4


def where(link: str) -> str:
    """A sandbox run's ``where`` column: ``sandbox 1gbit``."""
    return f"sandbox {link}"


def check_links(links) -> tuple[str, ...]:
    """The sweep's link rates, each one tc understands, checked before anything starts."""
    from ..sandbox.netns import parse_rate

    links = tuple(links or ())
    for rate in links:
        try:
            parse_rate(rate)
        except ConfigError:
            raise ConfigError("emulated_links", rate, 'each a rate such as 1gbit or 100mbit, '
                              'e.g. ["10gbit", "1gbit"]; [] for local ranks only') from None
    if len(set(links)) != len(links):
        raise ConfigError("emulated_links", list(links), "each rate once")
    return links


def unavailable() -> str | None:
    """Why this process cannot run the sandbox (None: it can)."""
    from ..sandbox.netns import Network, NetworkError
    from ..sandbox.status import missing_requirements

    missing = missing_requirements()
    if missing:
        return "the multi-node sandbox needs " + "; ".join(missing)
    try:
        Network.check()
    except NetworkError as exc:
        return str(exc)
    return None


def nodes_for(world_size: int) -> int:
    return math.ceil(world_size / RANKS_PER_NODE)


class SandboxLaunch(SandboxUse):
    """A study launcher, ``(config, world_size, timeout_s) -> summary row``, that runs each run
    across the sandbox's hosts by ``srun``. A sandbox already running in ``directory`` with
    ``nodes`` hosts is used and its links left unshaped on the way out; one started here is taken
    down. ``shape(link)`` sets every host's link before a rate's runs."""

    def __init__(self, nodes: int, directory: str | os.PathLike | None = None,
                 log: Callable[[str], None] = print) -> None:
        # one host has no link to shape; small runs just use the first
        super().__init__(directory, max(nodes, 2), log, link_system_conf=False)

    def __call__(self, config: TrainConfig, world_size: int, timeout_s: float) -> dict[str, Any]:
        nodes = nodes_for(world_size)
        if nodes > self.nodes:
            raise StudyError(f"{config.algorithm} on {world_size} ranks needs {nodes} hosts of "
                             f"{RANKS_PER_NODE} ranks; the sandbox has {self.nodes}")
        what = f"{config.algorithm} on {world_size} rank(s) across {nodes} sandbox host(s)"
        with tempfile.TemporaryDirectory(prefix="downpour-run-") as tmp:
            cfg, out = Path(tmp) / "config.json", Path(tmp) / "summary.json"
            cfg.write_text(json.dumps(config.to_dict(), default=str))
            cmd = ["srun", f"--nodes={nodes}", f"--ntasks={world_size}",
                   f"--ntasks-per-node={RANKS_PER_NODE}", "--distribution=block",
                   "--kill-on-bad-exit=1", f"--time={math.ceil(timeout_s / 60) + 1}",
                   sys.executable, "-m", "downpour_lib", "train", "--config", str(cfg),
                   "--summary-json", str(out)]
            try:
                proc = subprocess.run(cmd, env=self.env(), capture_output=True, text=True,
                                      timeout=timeout_s)
            except subprocess.TimeoutExpired as exc:
                raise StudyError(f"{what} ran past {timeout_s} s") from exc
            if proc.returncode != 0 or not out.exists():
                tail = "\n".join(((proc.stderr or "") + (proc.stdout or "")).splitlines()[-15:])
                raise StudyError(f"{what} failed (exit {proc.returncode}):\n{tail}")
            summary = json.loads(out.read_text())
        summary.pop("config", None)
        return summary
