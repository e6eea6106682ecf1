"""Checkpoints that are never half-written, load with ``weights_only=True``, and resume a run.

Every file is written to a temporary name, fsynced and renamed into place (``atomic_write_bytes``):
a reader, such as ``downpour evaluate --watch``, sees the old file or the new one, never a torn one,
even if the writer dies mid-write. A killed writer's temporary file is deleted by the next save in
its directory, unless a live writer still holds its lock on it (two runs writing one directory).

A checkpoint is one file, ``ckpt-<step>.pt``, written by one rank, the evaluator: for synchronous
algorithms it gathers every rank's state at the same step; for asynchronous ones it asks the
parameter servers for theirs by message (``Algorithm.points``). One file per checkpoint
means there is never a set of shard files of which some are missing (no manifest or two-phase
commit), at the price of moving every shard to one rank, which is small next to a step's traffic.

A checkpoint holds: ``step`` (steps completed), ``final``, ``config``, ``world_size``, ``model`` (the
parameters to evaluate), and ``ranks``: each rank's optimizer, algorithm and RNG state, and its
model state where it differs from ``model``. Only tensors and plain values, so ``weights_only``
loading works.
"""

from __future__ import annotations

import fcntl
import io
import os
import random
import re
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import CheckpointError, ConfigError

if TYPE_CHECKING:  # torch is imported where a function needs it: the atomic writes and the
    import torch  # directory scans serve commands that never load torch (sandbox, cluster)

FORMAT = "downpour-checkpoint-1"
NAME = re.compile(r"^ckpt-(\d+)\.pt$")
#: The temporary name atomic_write_bytes gives a checkpoint while writing it (mkstemp's letters).
TEMP = re.compile(r"^\.ckpt-\d+\.pt\.[a-z0-9_]+\.tmp$")

def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _locked_temp(path)
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide results from other readers
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def _locked_temp(path: Path) -> tuple[int, str]:
    """A new temporary file beside ``path``, locked until the rename: the lock tells
    ``remove_stale_temps`` the write is alive. Another process's cleanup can delete the file in the
    instant between its creation and the lock; then take another."""
    while True:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        _try_lock(fd)
        try:
            if os.path.samestat(os.fstat(fd), os.stat(tmp)):
                return fd, tmp
        except FileNotFoundError:
            pass
        os.close(fd)


def _try_lock(fd: int) -> bool:
    """An exclusive lock on the open file ``fd`` without waiting; False if another process holds
    one or the file system has no locks. The kernel drops it when its holder dies."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def remove_stale_temps(directory: str | os.PathLike) -> list[Path]:
    """Delete the temporary files that killed checkpoint writers left in ``directory``; the
    deleted paths. A write in progress (another process writing here) holds a lock on its file,
    so only files nobody holds are deleted; where the file system cannot lock, none are."""
    directory, removed = Path(directory), []
    if not directory.is_dir():
        return removed
    for path in directory.iterdir():
        if not TEMP.match(path.name):
            continue
        try:
            fd = os.open(path, os.O_RDWR)  # NFS locks a file exclusively only if open for writing
        except OSError:  # renamed into place meanwhile, or not ours to open
            continue
        try:
            if _try_lock(fd):
                path.unlink(missing_ok=True)
                removed.append(path)
        finally:
            os.close(fd)
    return removed


# -- files -------------------------------------------------------------------------------------

def checkpoint_path(directory: str | os.PathLike, step: int) -> Path:
    return Path(directory) / f"ckpt-{step:08d}.pt"


def save(directory: str | os.PathLike, state: dict[str, Any]) -> Path:
    """Write ``state`` as the checkpoint of its step, atomically; its path. Temporary files that
    killed writers left in ``directory`` are deleted first."""
    import torch

    remove_stale_temps(directory)
    buffer = io.BytesIO()
    torch.save({"format": FORMAT, **state}, buffer)
    path = checkpoint_path(directory, int(state["step"]))
    atomic_write_bytes(path, buffer.getvalue())
    return path


def prune(directory: str | os.PathLike, keep: int, same: dict[str, Any], world_size: int,
          protect: Sequence[str | os.PathLike] = ()) -> list[Path]:
    """Delete this configuration's periodic checkpoints in ``directory`` but its newest ``keep``;
    the deleted paths, oldest first. Left alone: final checkpoints, other configurations' (those
    that differ in ``same``, ``TrainConfig.held("match")``, as ``find_resumable`` tells them
    apart), files that do not load, temporary files and ``protect`` (the checkpoint a run resumed
    from). Called once a new checkpoint is in place, so the newest
    is whole before an older one goes; each deletion is one unlink, so a reader (``resume``,
    ``evaluate --watch``) finds a whole file or none, and one that has it open keeps reading it."""
    kept, doomed = 0, []
    spared = {Path(p).resolve() for p in protect}
    for _, path in reversed(scan(directory)):
        try:
            state = load(path, mmap=True)
        except CheckpointError:
            continue
        if state["final"] or state["world_size"] != world_size \
                or _difference(state, same) is not None:
            continue
        kept += 1
        if kept > keep and path.resolve() not in spared:
            doomed.append(path)
    for path in reversed(doomed):
        path.unlink(missing_ok=True)
    return doomed[::-1]


def load(path: str | os.PathLike, mmap: bool = False) -> dict[str, Any]:
    """Read a checkpoint (tensors and plain values only); CheckpointError says what is wrong."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:  # torch raises many kinds for a torn or foreign file
        raise CheckpointError(f"{path}: unreadable ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0] if str(exc) else 'no detail'})") from exc
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a downpour checkpoint")
    missing = [k for k in ("step", "final", "config", "world_size", "model", "ranks") if k not in state]
    if missing:
        raise CheckpointError(f"{path}: incomplete, missing {', '.join(missing)}")
    return state


def scan(directory: str | os.PathLike) -> list[tuple[int, Path]]:
    """(step, path) of every checkpoint file in ``directory``, oldest first; temporary files of
    writes in progress (dot-names) are not checkpoints."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := NAME.match(p.name))]
    return sorted(found)


def latest(directory: str | os.PathLike,
           report: Callable[[str], None] = lambda message: None) -> Path | None:
    """The newest checkpoint in ``directory`` that loads; unreadable ones are reported, skipped."""
    for _, path in reversed(scan(directory)):
        try:
            load(path, mmap=True)
        except CheckpointError as exc:
            report(f"skipping {exc}")
            continue
        return path
    return None


# -- resuming ----------------------------------------------------------------------------------

def resolve(resume: str, report: Callable[[str], None]) -> Path:
    """The checkpoint ``resume`` names: a file, or the newest readable one in a directory; each
    newer one that does not load is reported, with why, and skipped."""
    path = Path(resume)
    if path.is_file():
        return path
    if path.is_dir():
        skipped: list[str] = []
        found = latest(path, skipped.append)
        for message in skipped:
            report(f"{message}; resuming from {found}" if found else message)
        if found is None:
            raise ConfigError("resume", resume, "the directory holds no readable checkpoint "
                                                "(ckpt-<step>.pt); give a run's checkpoint_dir")
        return found
    raise ConfigError("resume", resume, "no such file or directory; give a checkpoint_dir of an "
                                        "earlier run or one of its ckpt-<step>.pt files")


def find_resumable(directory: str | os.PathLike, same: dict[str, Any], world_size: int,
                   report: Callable[[str], None]) -> Path | None:
    """``resume=auto``: the newest checkpoint in ``directory`` that loads and was written by this
    configuration (equal in ``same``: ``TrainConfig.held("match")``) on as many ranks, or None
    (the run starts from scratch). What is passed over, and why, is reported."""
    for _, path in reversed(scan(directory)):
        try:
            state = load(path, mmap=True)
        except CheckpointError as exc:
            report(f"resume auto: skipping {exc}")
            continue
        different = _difference(state, same)
        if different is None and state["world_size"] != world_size:
            different = f"world_size={state['world_size']}, this launch has {world_size}"
        if different is None:
            return path
        report(f"resume auto: skipping {path}, another configuration ({different})")
    return None


def _difference(state: dict[str, Any], same: dict[str, Any]) -> str | None:
    """The first field of ``same`` whose value differs from the checkpoint's, as name=written
    value. ``same`` holds the fields a rule holds, as the config's fields declare them
    (``TrainConfig.held``): this module compares, the config says what."""
    written = state["config"]
    for name, value in same.items():
        if name in written and written[name] != value:  # older checkpoints lack some
            return f"{name}={written[name]!r}"
    return None


def check_resume(state: dict[str, Any], path: Path, keep: dict[str, Any], world_size: int,
                 total_steps: int) -> int:
    """Refuse to continue a different run (one that changes a field of ``keep``:
    ``TrainConfig.held("keep")``); the step to continue from."""
    different = _difference(state, keep)
    if different is not None:
        name = different.split("=", 1)[0]
        raise ConfigError(name, keep[name], f"the checkpoint {path} was written with "
                                                  f"{different}; a resumed run must keep it")
    if state["world_size"] != world_size:
        raise ConfigError("resume", str(path),
                          f"was written by a run of {state['world_size']} ranks but this launch has "
                          f"{world_size}; launch {state['world_size']} ranks to continue it")
    step = int(state["step"])
    if step >= total_steps:
        raise ConfigError("resume", str(path),
                          f"the run already trained {step} of the {total_steps} steps asked for; "
                          "give more steps or epochs to continue it")
    return step


def rng_state() -> dict[str, Any]:
    import torch

    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import torch

    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def rank_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               algorithm_state: dict[str, Any], scaler: Any = None) -> dict[str, Any]:
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "algorithm": algorithm_state, "rng": rng_state()}
    if scaler is not None:  # fp16's loss scale
        state["scaler"] = scaler.state_dict()
    return state


def assemble(step: int, final: bool, time_s: float, config: dict[str, Any], world_size: int,
             model: dict[str, torch.Tensor], ranks: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The checkpoint's contents; a rank's model state equal to ``model`` is stored once."""
    import torch

    for entry in ranks.values():
        own = entry.get("model")
        if own is not None and own.keys() == model.keys() and all(
                torch.equal(own[k].cpu(), model[k].cpu()) for k in model):
            del entry["model"]
    return {"step": step, "final": final, "time_s": time_s, "wall_time": time.time(),
            "config": config, "world_size": world_size, "model": model, "ranks": ranks}


def restore(state: dict[str, Any], rank: int, model: torch.nn.Module,
            optimizer: torch.optim.Optimizer, algorithm: Any, scaler: Any = None) -> None:
    """Put this rank's part of a checkpoint back (a rank with no entry keeps its fresh state)."""
    entry = state["ranks"].get(rank, {})
    model.load_state_dict(entry.get("model", state["model"]))
    if "optimizer" in entry:
        optimizer.load_state_dict(entry["optimizer"])
    if entry.get("algorithm"):
        algorithm.load_state_dict(entry["algorithm"])
    if "rng" in entry:
        set_rng_state(entry["rng"])
    if scaler is not None and "scaler" in entry:
        scaler.load_state_dict(entry["scaler"])
