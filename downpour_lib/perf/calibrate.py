"""Calibrating the performance model on this machine's measurements, and checking it against them.

- The link: ``downpour bench collectives`` rows (allreduce; broadcast at two ranks) fitted to the
  alpha-beta costs of ``netmodel`` by least squares on relative error (so a 4 KiB case weighs as much
  as a 64 MiB one: the small sizes fix alpha, the large ones beta).
- The workloads: a study CSV's one-worker runs, or run summaries (``downpour train --summary-json``),
  give each model's compute time per step (the step less its communication and waiting) and, from an
  allreduce row, the bytes a step moves (else the model's parameters).
- The overlap: how much of the ideal bucket pipeline the allreduce runs achieved (``perfmodel``).

``compare_with_study`` then predicts every measured row from the calibration and reports the error;
``compare_staleness`` runs the simulation of every measured Downpour run of a staleness study and sets
the simulated staleness distribution beside the measured one.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..defaults import RUN_TIMEOUT_S
from ..errors import ConfigError
from ..traffic import ring_share
from .calibration import Calibration, Workload
from .netmodel import Link, Network
from .perfmodel import bucketed_allreduce_s, modelled_options, predict

#: columns of a study row that are communication or waiting, not computation
_NOT_COMPUTE = ("comm_s", "wait_s")
_PS = ("sync_ps", "downpour", "easgd", "easgd_async")


def _read_json(field: str, path: str | os.PathLike, make: str, writer: str) -> Any:
    """``path``'s JSON; a ConfigError naming ``field`` if it is missing (``make``: how to write
    it) or not JSON (``writer``: what should have written it)."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(field, str(path), f"no such file: {make}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(field, str(path), f"not JSON ({exc}): give the file `{writer}` "
                          "wrote") from None


def read_collectives(path: str | os.PathLike) -> list[dict[str, Any]]:
    rows = _read_json("collectives", path,
                      "write it with `mpiexec -n 2 downpour bench collectives --json FILE`",
                      "downpour bench collectives --json")
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "p50_s" in r for r in rows):
        raise ConfigError("collectives", str(path), "not `downpour bench collectives` rows")
    return rows


def measure_collectives(path: str | os.PathLike, ranks: int = 2, sizes: str = "4K,256K,4M,32M",
                        backends: str = "gloo,mpi", timeout_s: float = RUN_TIMEOUT_S) -> Path:
    """Run ``downpour bench collectives`` (allreduce and broadcast) on ``ranks`` MPI ranks here and
    write its rows to ``path``: the measurement a calibration of this machine starts from."""
    import subprocess
    import sys

    from ..cluster.mpiexec import find_mpiexec, run_mpiexec

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [find_mpiexec(), "-n", str(ranks), "--oversubscribe", "--bind-to", "none",
           sys.executable, "-m", "downpour_lib", "bench", "collectives", "--backends", backends,
           "--ops", "allreduce,broadcast", "--sizes", sizes, "--min-time", "0.1",
           "--min-reps", "5", "--json", str(path)]
    proc = run_mpiexec(cmd, capture_output=True, text=True, timeout_s=timeout_s)
    if proc.returncode != 0 or not path.is_file():
        tail = "\n".join((proc.stderr or proc.stdout).splitlines()[-15:])
        raise subprocess.CalledProcessError(proc.returncode, cmd, output=tail)
    return path


def _design(rows: list[dict[str, Any]], backend: str) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares rows of ``backend``'s allreduce rows (a ring: 2(n-1) messages, its share of
    the bytes each way, (n-1)/n of them reduced) and its broadcast rows at two ranks (one message,
    nothing reduced), columns (messages, bytes sent, bytes reduced), and their p50 times."""
    design, times = [], []
    for r in rows:
        if r.get("backend") != backend or r.get("world_size", 1) < 2:
            continue
        n, m = r["world_size"], r["bytes"]
        if r["op"] == "allreduce":
            design.append((2 * (n - 1), float(ring_share("allreduce", n)) * m, (n - 1) / n * m))
        elif r["op"] == "broadcast" and n == 2:
            design.append((1, m, 0.0))
        else:
            continue
        times.append(r["p50_s"])
    return np.array(design, dtype=float).reshape(-1, 3), np.array(times, dtype=float)


def fit_link(rows: list[dict[str, Any]], backend: str) -> Link:
    """alpha and beta of ``backend`` from its allreduce rows (a ring's cost), and its broadcast rows
    at two ranks (one message). A broadcast among more ranks is left out: its cost depends on the
    backend's algorithm (gloo's root sends to every rank in turn, n-1 messages on its card; Open
    MPI's binomial tree takes log2 n rounds), and measured on four sandbox nodes, fitting it as a tree
    put the fitted bandwidth 17% low."""
    a, t = _design(rows, backend)
    a = a[:, :2]
    if len(t) < 2:
        found = sorted({r.get("backend") for r in rows})
        raise ConfigError("backend", backend, f"needs allreduce or broadcast rows at 2 or more "
                          f"ranks at two sizes or more; the file has backends {found}")
    weight = 1 / t  # relative error
    (alpha, inv_beta), *_ = np.linalg.lstsq(a * weight[:, None], t * weight, rcond=None)
    if alpha < 0:  # latency below resolution: fit the bandwidth alone
        alpha = 0.0
        inv_beta = float(np.sum(a[:, 1] * t * weight**2) / np.sum((a[:, 1] * weight) ** 2))
    if inv_beta <= 0:
        raise ConfigError("collectives", backend, "times do not grow with size: measure larger "
                          "sizes (--sizes 4K,1M,64M)")
    return Link(float(alpha), float(1 / inv_beta))


def fit_reduction(rows: list[dict[str, Any]], backend: str) -> tuple[Link, float]:
    """(the link, gamma: seconds per byte reduced) of ``backend``, the three fitted together: a
    ring allreduce of M over n ranks costs ``2(n-1) alpha + 2(n-1)/n M / beta + (n-1)/n M gamma``,
    a broadcast at two ranks ``alpha + M / beta`` and no reduction, which separates gamma from
    beta. Without broadcast rows (or where gamma comes out negative) gamma is 0 and the link is
    ``fit_link``'s."""
    a, t = _design(rows, backend)
    if len(t) < 4 or not (a[:, 2] > 0).any() or (a[:, 2] > 0).all():
        return fit_link(rows, backend), 0.0
    weight = 1 / t
    (alpha, inv_beta, gamma), *_ = np.linalg.lstsq(a * weight[:, None], t * weight, rcond=None)
    if alpha < 0 or inv_beta <= 0 or gamma <= 0:
        return fit_link(rows, backend), 0.0
    return Link(float(alpha), float(1 / inv_beta)), float(gamma)


def fit_wake(rows: list[dict[str, Any]], backend: str, net: Network,
             most_ranks: int | None = None) -> float:
    """``Network.wake_s`` of ``backend``: what each hop costs a rank beyond the link's latency
    when the node's ranks exceed its ``net.cores``, from its allreduce rows at more ranks than
    cores (up to ``most_ranks``), by least squares on relative error against ``allreduce_s``'s
    crowded ring (the link, gamma and crowding as ``net`` has them). 0 without such rows, or
    where the crowded ring alone is already as slow as they were."""
    from .netmodel import allreduce_s

    if not net.cores:
        return 0.0
    a, b, t = [], [], []
    for r in rows:
        n = r.get("world_size", 1)
        if (r.get("backend") != backend or r.get("op") != "allreduce" or n <= net.cores
                or (most_ranks is not None and n > most_ranks)):
            continue
        one_node = replace(net, per_node=max(net.per_node, n), wake_s=0.0)
        a.append(allreduce_s(n, r["bytes"], one_node))
        b.append(2 * (n - 1) * one_node.crowding(n))  # the ring's hops, each crowded
        t.append(r["p50_s"])
    if not t:
        return 0.0
    a, b, t = (np.array(v, dtype=float) for v in (a, b, t))
    wake = float(np.sum(b / t * (t - a) / t) / np.sum((b / t) ** 2))
    return max(0.0, wake)


def node_memory_Bps(rows: list[dict[str, Any]]) -> float | None:
    """The host's memory throughput, bytes/s: ``bench collectives``' memcpy row of the largest
    size (one thread copying, the ceiling a node's shared-memory transfers share); None without."""
    copies = [r for r in rows if r.get("backend") == "memcpy" and r.get("p50_s", 0) > 0]
    if not copies:
        return None
    largest = max(copies, key=lambda r: r["bytes"])
    return float(largest["bytes"] / largest["p50_s"])


def _compute_steps(path: str | os.PathLike, warmup_steps: int, columns: tuple[str, ...] = (),
                   workers_only: bool = False) -> tuple[pd.DataFrame, pd.Series]:
    """A run's ``steps.csv`` (``downpour train --output-dir``) past ``warmup_steps`` (and only
    its workers' rows), and each row's compute: its step less communication and waiting. Every
    file error names ``steps``."""
    try:
        steps = pd.read_csv(path)
    except FileNotFoundError:
        raise ConfigError("steps", str(path), "no such file: `downpour train --output-dir DIR` "
                          "writes DIR/steps.csv") from None
    missing = [c for c in (*columns, "step_s") if c not in steps]
    if missing:
        raise ConfigError("steps", str(path), f"has no {', '.join(missing)} column: give a run's "
                          "steps.csv (`downpour train --output-dir DIR`)")
    if workers_only and "role" in steps:
        steps = steps[steps["role"] == "worker"]
    if "step" in steps:
        steps = steps[steps["step"] >= warmup_steps]
    if steps.empty:
        whose = "worker's " if workers_only else ""
        raise ConfigError("steps", str(path), f"no {whose}step past the first {warmup_steps} (the "
                          "warm-up): give a run's steps.csv of more steps, e.g. --steps 30")
    return steps, steps["step_s"] - steps[[c for c in _NOT_COMPUTE if c in steps]].sum(axis=1)


def jitter_from_steps(path: str | os.PathLike, warmup_steps: int = 5) -> float:
    """The spread of a run's compute per step: the coefficient of variation of each worker's
    step less its communication and waiting (``steps.csv`` of ``downpour train --output-dir``),
    past ``warmup_steps``, the mean over workers. A synchronous step waits for the slowest of N
    such draws (``terms.straggler_factor``)."""
    from .terms import step_spread

    steps, busy = _compute_steps(path, warmup_steps)
    ranks = steps["rank"] if "rank" in steps else pd.Series(0, index=steps.index)
    return float(np.mean([step_spread(list(group)) for _, group in busy.groupby(ranks)]))


@dataclass(frozen=True)
class Spreads:
    """What one run's ``steps.csv`` says of the three spreads a synchronous step waits on
    (``terms.straggler_factor``), each a coefficient of variation of the workers' compute a step;
    None where the run cannot tell it (one host, one rank a host, one rank)."""

    jitter: float  # a step's own, about its rank's mean
    device_spread: float | None  # the ranks' means about their host's, less what jitter leaves
    node_spread: float | None  # the hosts' means about the run's, less what the above leave
    ranks: int
    hosts: int  # 0: the file names none (a run of a version before the host column)
    steps: int  # per rank, past the warm-up (the fewest any rank has)


def spreads_from_steps(path: str | os.PathLike, warmup_steps: int = 5) -> Spreads:
    """The jitter, the devices' and the nodes' spread of a run across nodes, from its workers'
    compute per step (``step_s`` less communication and waiting) past ``warmup_steps``, read as
    nested random effects: a step's own noise about its rank's mean, a rank's mean about its
    host's, a host's about the run's. A mean of ``k`` draws keeps 1/k of their variance, so each
    level's variance is what its means spread less what the level below leaves in them (at least
    0). The hosts are ``steps.csv``'s ``host`` column, written by runs of this version."""
    steps, busy = _compute_steps(path, warmup_steps, ("rank", "step"), workers_only=True)
    named = "host" in steps  # runs before this version's steps.csv name none
    hosts = steps["host"].astype(str) if named else pd.Series("", index=steps.index)
    per_rank = busy.groupby(steps["rank"])
    means, counts = per_rank.mean(), per_rank.count()
    if counts.min() < 2:
        raise ConfigError("steps", str(path), "a rank with one step past the warm-up: give a "
                          "run of more steps, e.g. --steps 30")
    grand = float(means.mean())
    within = float(per_rank.var(ddof=1).mean())  # a step about its rank's mean
    n = int(counts.min())
    host_of = hosts.groupby(steps["rank"]).first()
    by_host = means.groupby(host_of)
    per_host = int(by_host.count().min())
    device = node = None
    if per_host > 1:  # ranks beside each other on a host
        spread = float(by_host.var(ddof=1).mean())
        device = max(0.0, spread - within / n)
    if named and by_host.ngroups > 1:  # hosts beside each other
        spread = float(by_host.mean().var(ddof=1))
        node = max(0.0, spread - ((device or 0.0) + within / n) / per_host)

    def cv(variance: float | None) -> float | None:
        return None if variance is None else math.sqrt(variance) / grand

    return Spreads(jitter=math.sqrt(within) / grand, device_spread=cv(device), node_spread=cv(node),
                   ranks=len(means), hosts=by_host.ngroups if named else 0, steps=n)


def _compute_s(rows: pd.DataFrame) -> float:
    return float((rows["step_s"] - rows[list(_NOT_COMPUTE)].sum(axis=1)).mean())


def _update_s(rows: pd.DataFrame) -> float:
    """The update a run pays once a step (``update_s``: the optimizer's step, and its algorithm's
    packing and copying), from the rows that ran one pass a step; 0 where none did or the rows do
    not have it (a run that accumulated records a pass as its step, and the update in one of them)."""
    if "options.accumulation_steps" in rows:
        rows = rows[rows["options.accumulation_steps"].fillna(1) == 1]
    if "update_s" not in rows or rows["update_s"].isna().all():
        return 0.0
    return max(0.0, float(rows["update_s"].mean()))


def parameter_bytes(model: str, dataset: str, data_dir: str = "data") -> float:
    """Bytes of one copy of ``model``'s parameters as built for ``dataset``'s images (on the meta
    device: ``models.build_shaped``): what one allreduce, push or gossip message of it carries."""
    from ..comm.collectives import nbytes
    from ..data import load_dataset
    from ..models import build_shaped

    train = load_dataset(dataset, data_dir).train
    return float(sum(nbytes(p) for p in
                     build_shaped(model, train.input_shape, train.num_classes).parameters()))


def workloads_from_study(study: pd.DataFrame, source: str) -> dict[str, Workload]:
    """Each model's workload from the study's one-worker runs: its compute a step, the bytes it
    sends, and its update once a step (``_update_s``)."""
    out = {}
    for model, runs in study.groupby("model"):
        alone = runs[(runs["num_workers"] == 1) & ~runs["algorithm"].isin(_PS)]
        if alone.empty:
            alone = runs[runs["num_workers"] == 1]
        if alone.empty:
            continue
        sent = runs[runs["algorithm"].isin(("allreduce", "ddp")) & (runs["num_workers"] > 1)]
        if not sent.empty:  # a ring allreduce sends 2(n-1)/n of the buffer
            n = sent["num_workers"]
            share = n.map(lambda k: float(ring_share("allreduce", k)))
            nbytes = float((sent["bytes_sent_per_step"] / share).median())
        else:
            data_dir = runs["data_dir"].iloc[0] if "data_dir" in runs else "data"
            nbytes = parameter_bytes(model, str(runs["dataset"].iloc[0]), str(data_dir))
        out[model] = Workload(model, int(alone["batch_size"].iloc[0]), _compute_s(alone), nbytes,
                              source=f"{len(alone)} one-worker runs of {source}",
                              optimizer_s=(_update_s(alone),) * 2, measured_accumulation=1)
    if not out:
        raise ConfigError("study", source, "has no one-worker runs to take compute times from: "
                          "run the study with --workers 1,2")
    return out


def overlap_from_study(cal: Calibration, study: pd.DataFrame) -> float:
    """Share of the ideal bucket pipeline the measured allreduce runs achieved, in [0, 1]."""
    shares = []
    full = replace(cal, overlap=1.0)
    for _, r in study[study["algorithm"].isin(("allreduce", "ddp"))
                      & (study["num_workers"] > 1)].iterrows():
        if r["model"] not in cal.workloads:
            continue
        total, ideal = bucketed_allreduce_s(int(r["num_workers"]), cal.workloads[r["model"]], full)
        if total - ideal > 1e-9:
            shares.append((total - r["comm_s"]) / (total - ideal))
    return float(min(1.0, max(0.0, np.median(shares)))) if shares else 0.0


def calibrate(collectives: str | os.PathLike, study: str | os.PathLike | pd.DataFrame,
              backend: str | None = None, per_node: int | None = None,
              inter: Link | None = None) -> Calibration:
    """A calibration of this machine: its link, its models' compute, its overlap (``study``: a
    study's runs.csv, or its rows). ``per_node`` workers share the measured link (default: the
    study's largest world); past them, nodes are joined by ``inter`` (default: the measured link)."""
    runs = read_study(study)
    rows = read_collectives(collectives)
    backend = backend or pick_backend(runs, rows, str(collectives))[0]
    link, gamma = fit_reduction(rows, backend)
    per_node = per_node or int(runs["world_size"].max())
    cores = int(runs["cores"].min()) if "cores" in runs and runs["cores"].notna().any() else None
    host = str(runs["host"].iloc[0]) if "host" in runs else "here"
    buckets = runs["options.bucket_cap_mb"].dropna() if "options.bucket_cap_mb" in runs else []
    between = ""
    if inter is not None:
        between = (f"; between nodes of {per_node} workers (assumed): "
                   f"{inter.bandwidth_Bps * 8 / 1e9:g} Gbit/s, {inter.alpha_s * 1e6:g} us")
    network = Network(link, inter or link, per_node, gamma_s_per_byte=gamma,
                      node_Bps=node_memory_Bps(rows), cores=cores)
    network = replace(network, wake_s=fit_wake(rows, backend, network))
    cal = Calibration(f"measured-{host}", network,
                      workloads_from_study(runs, _name(study)), collective="ring",
                      bucket_bytes=(float(buckets.median()) if len(buckets) else 25.0) * (1 << 20),
                      overlap=0.0, source=f"link: {backend} rows of {collectives}; compute: "
                                          f"{_name(study)}{between}")
    return replace(cal, overlap=overlap_from_study(cal, runs))


#: what ``bench collectives`` reports besides torch's backends: references, not a run's link
_REFERENCES = ("memcpy", "mpi4py")


def pick_backend(runs: pd.DataFrame, rows: list[dict[str, Any]],
                 where: str = "the collectives file") -> tuple[str, str]:
    """Whose link to fit, and why: the runs' backend. A one-process run has none ("none" in its
    summary): then the one a launch of several would pick under the same launcher (mpi under
    mpiexec, else gloo; the config's own choice where it named one), or, as a one-worker run moved
    nothing over any backend, the one backend the file measured."""
    measured = sorted({str(r.get("backend")) for r in rows if r.get("world_size", 1) >= 2}
                      - set(_REFERENCES))
    used = {str(b) for b in runs.get("backend", pd.Series(dtype=str)).dropna()} - {"none"}
    alone = bool((runs["num_workers"] == 1).all())
    if used:
        wanted, why = str(runs.loc[runs["backend"].isin(used), "backend"].mode().iloc[0]), "the runs'"
    else:
        named = {str(b) for b in runs.get("config_backend", pd.Series(dtype=str)).dropna()}
        named -= {"auto", "none"}
        launchers = set(runs.get("launcher", pd.Series(dtype=str)).dropna())
        wanted = named.pop() if len(named) == 1 else ("mpi" if "mpi" in launchers else "gloo")
        why = "one process's run had no backend; a launch of several would use"
    if wanted in measured:
        return wanted, f"{why} {wanted}"
    if alone and measured:
        chosen = "gloo" if "gloo" in measured else measured[0]
        return chosen, (f"the runs would use {wanted}, which {where} has no rows of; one worker "
                        f"moved nothing over it, so the link is {chosen}'s (measured)")
    raise ConfigError("backend", wanted, f"the runs used {wanted} but {where} measured "
                      f"{measured or 'no backend at 2 or more ranks'}: measure it with "
                      f"`downpour bench collectives --backends {wanted} --json FILE` under "
                      "mpiexec, or give --backend")


def read_summaries(paths: list[str | os.PathLike]) -> pd.DataFrame:
    """Run summaries (``downpour train --summary-json``) as the rows of a study: one per run,
    the config's backend choice beside the one the run used."""
    rows = []
    for path in paths:
        summary = _read_json("summary", path,
                             "write one with `downpour train --model M --steps 30 --summary-json FILE`",
                             "downpour train --summary-json")
        missing = (_NEEDED - set(summary)) if isinstance(summary, dict) else _NEEDED
        if missing:
            raise ConfigError("summary", str(path), f"lacks {sorted(missing)}: give the file "
                              "`downpour train --summary-json` wrote")
        config = summary.pop("config", None) or {}
        rows.append({**summary, "config_backend": config.get("backend")})
    if not rows:
        raise ConfigError("summary", "", "give one or more `downpour train --summary-json` files")
    runs = pd.DataFrame(rows)
    runs.attrs["source"] = ", ".join(str(p) for p in paths)  # what calibrations name as their source
    return runs


def _name(study: str | os.PathLike | pd.DataFrame) -> str:
    if isinstance(study, pd.DataFrame):
        return str(study.attrs.get("source", "the study's rows"))
    return str(study)


_NEEDED = {"algorithm", "model", "num_workers", "world_size", "step_s", "comm_s", "wait_s",
           "batch_size"}


def read_study(path: str | os.PathLike | pd.DataFrame) -> pd.DataFrame:
    if isinstance(path, pd.DataFrame):
        runs = path
    else:
        try:
            runs = pd.read_csv(path)
        except FileNotFoundError:
            raise ConfigError("study", str(path), "no such CSV: the committed one is "
                              "results/reference/scaling/runs.csv") from None
        runs.attrs["source"] = str(path)
    missing = _NEEDED - set(runs.columns)
    if missing:
        raise ConfigError("study", _name(path), f"lacks {sorted(missing)}: give a study's runs.csv")
    if "compute" in runs:  # an emulated run's compute is a sleep: nothing to calibrate on
        runs = runs[runs["compute"].fillna("real") == "real"]
    return runs


def compare_with_study(cal: Calibration, study: str | os.PathLike | pd.DataFrame) -> pd.DataFrame:
    """Measured and predicted step time of every (algorithm, workers, model) in the study."""
    runs = read_study(study)
    rows = []
    for (algorithm, workers, model), group in runs.groupby(["algorithm", "num_workers", "model"]):
        p = predict(cal, algorithm, int(workers), model, modelled_options(group.iloc[0]))
        measured = float(group["step_s"].mean())
        rows.append({"algorithm": algorithm, "workers": int(workers), "model": model,
                     "measured_step_s": measured, "predicted_step_s": p.step_s,
                     "error": p.step_s / measured - 1, "runs": len(group),
                     "calibration": cal.name})
    return pd.DataFrame(rows)


def save(cal: Calibration, path: str | os.PathLike) -> Path:
    from ..checkpoint import atomic_write_text

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(cal.to_dict(), indent=1) + "\n")
    return path


def load(path: str | os.PathLike) -> Calibration:
    try:
        return Calibration.from_dict(json.loads(Path(path).read_text()))
    except FileNotFoundError:
        raise ConfigError("calibration", str(path), "no such file: make it with `downpour model "
                          "calibrate`, or give --preset") from None
    except (KeyError, TypeError, json.JSONDecodeError) as exc:
        raise ConfigError("calibration", str(path), f"not a calibration ({exc!r}): give the file "
                          "`downpour model calibrate` wrote") from None


#: the simulated runs' step times vary by this coefficient of variation, over ``STALENESS_SEEDS``
#: draws whose distributions are averaged. Without it two equal workers lock into one phase, and
#: which phase depends on the fitted link to the microsecond: fetch=4 push=1 took any mean from
#: 3.37 to 3.83 updates as a link measured under load moved. 1% is far less than a real step varies
#: but enough: over 300 steps the phase drifts across a neighbourhood, so that mean moves by under
#: 0.07 updates over any link from 1 us to 1 ms and 0.1 to 50 GB/s (more jitter moves it no further).
STALENESS_JITTER, STALENESS_SEEDS = 0.01, 4

#: what a simulated mean staleness must come within of the measured one: three quarters of an update,
#: or 25% where that is more. The simulation is ahead by about half an update where a worker pushes
#: every step to one shard (fetch=1 push=1: 0.93 against 0.36; fetch=4 push=1: 3.8 against 3.13):
#: the measured workers take turns at their server far more often than any phase of the simulation
#: does (74% fresh pushes against 9%), which we take to come from the two workers and their server
#: sharing two cores, a coupling the simulation does not have.
STALENESS_TOLERANCE = (0.75, 0.25)


def compare_staleness(link: Link, staleness_dir: str | os.PathLike) -> tuple[pd.DataFrame,
                                                                             pd.DataFrame]:
    """Every Downpour run of a staleness study (``runs.csv``, ``staleness.csv``) simulated with its
    own settings (workers, shards, n_fetch, n_push, warmstart, steps) and its measured compute per
    step (data, forward and backward, update) over ``link``, ``STALENESS_SEEDS`` times with steps
    that vary by ``STALENESS_JITTER``, the distributions averaged.

    Returns (one row per run: measured and simulated mean staleness, share of fresh pushes, the
    total variation distance between the distributions, and whether the means agree within
    ``STALENESS_TOLERANCE``; the two distributions, long: label, staleness, fraction, source)."""
    from .perfsim import simulate

    directory = Path(staleness_dir)
    try:
        runs = pd.read_csv(directory / "runs.csv")
        measured = pd.read_csv(directory / "staleness.csv")
    except FileNotFoundError as exc:
        raise ConfigError("staleness", str(directory), f"{exc.filename} is missing: give a staleness "
                          "study's directory, e.g. results/reference/staleness") from None
    rows, dists = [], []
    for _, run in runs[runs["algorithm"] == "downpour"].iterrows():
        options = {k: v for k, v in modelled_options(run).items()
                   if k in ("n_fetch", "n_push", "warmstart")}
        compute = float(run["data_s"] + run["compute_s"] + run["update_s"])
        setting = {"compute_s": compute, "link": link, "steps": int(run["steps"]),
                   "model_bytes": float(run["bytes_sent_per_step"]) * options.get("n_push", 1),
                   "servers": int(run["num_servers"]), "jitter": STALENESS_JITTER, **options}
        s: dict[int, float] = {}
        for seed in range(STALENESS_SEEDS):
            sim = simulate("downpour", int(run["num_workers"]), seed=seed, **setting)
            for k, v in sim.staleness_fraction.items():
                s[k] = s.get(k, 0.0) + v / STALENESS_SEEDS
        s = dict(sorted(s.items()))
        mine = measured[measured["run_id"] == run["run_id"]]
        m = dict(zip(mine["staleness"].astype(int), mine["fraction"], strict=True))
        m_mean = sum(k * v for k, v in m.items())
        s_mean = sum(k * v for k, v in s.items())
        tolerance = max(STALENESS_TOLERANCE[0], STALENESS_TOLERANCE[1] * m_mean)
        rows.append({"label": run["label"], "workers": int(run["num_workers"]),
                     "servers": int(run["num_servers"]), **options,
                     "measured_mean": m_mean, "simulated_mean": s_mean,
                     "measured_fresh": m.get(0, 0.0), "simulated_fresh": s.get(0, 0.0),
                     "tv_distance": 0.5 * sum(abs(m.get(k, 0.0) - s.get(k, 0.0))
                                              for k in set(m) | set(s)),
                     "agrees": abs(s_mean - m_mean) <= tolerance})
        dists += [{"label": run["label"], "staleness": k, "fraction": v, "source": source}
                  for source, dist in (("measured", m), ("simulated", s)) for k, v in dist.items()]
    if not rows:
        raise ConfigError("staleness", str(directory), "has no downpour runs to compare")
    return pd.DataFrame(rows), pd.DataFrame(dists)
