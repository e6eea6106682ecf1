"""The evaluator: scores each new checkpoint on the test split while training runs.

ps_pytorch ran a separate evaluator process beside its parameter servers, so that the workers never
pause to evaluate; DistBelief did the same. ``downpour evaluate --checkpoint-dir DIR --watch`` polls
DIR, evaluates every checkpoint it has not scored yet (oldest first), and appends one row per
checkpoint to a CSV: the step, when it was written (seconds into training and wall-clock time),
the test loss and accuracy. A file that cannot be read (corrupt, truncated, foreign) is reported
once and skipped; it never stops the evaluator. It stops once the newest checkpoint is a final one,
at ``until_step``, or after ``timeout_s``.

Checkpoints are written atomically (``checkpoint.atomic_write_bytes``), so a file under a
checkpoint's name is complete; in-progress writes are dot-named temporary files, never read.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from . import checkpoint
from .checkpoint import atomic_write_text
from .config import Length
from .data import Splits, load_dataset
from .data.loader import eval_indices
from .defaults import EVAL_POLL_S
from .engine import evaluate
from .errors import CheckpointError, ConfigError, DownpourError
from .models import build_model

COLUMNS = ("step", "final", "time_s", "wall_time", "evaluated_at", "loss", "accuracy", "samples",
           "file")


def _stderr(message: str) -> None:
    print(f"downpour evaluate: {message}", file=sys.stderr, flush=True)


@dataclass
class Evaluator:
    """Scores the checkpoints of one directory into one CSV (resumable: scored steps are kept)."""

    directory: Path
    csv: Path
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    batch_size: int = Length.eval_batch_size
    data_dir: str | None = None  # None: the one the run was configured with
    samples: int = 0  # of the test split, spread evenly over it (a run's eval_samples); 0: all
    log: Callable[[str], None] = print
    report: Callable[[str], None] = _stderr
    _splits: dict[tuple[str, str], Splits] = field(default_factory=dict)
    _bad: set[tuple[str, int, int]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.directory, self.csv = Path(self.directory), Path(self.csv)
        self.rows: list[dict[str, Any]] = self._earlier_rows() if self.csv.exists() else []
        self.scored = {int(r["step"]) for r in self.rows}

    def _earlier_rows(self) -> list[dict[str, Any]]:
        """The rows an earlier evaluation of the run wrote to ``csv``, which this one continues;
        a file of anything else is refused, not overwritten."""
        try:
            frame = pd.read_csv(self.csv)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError,
                IsADirectoryError) as exc:
            frame, why = None, f"cannot be read as a CSV ({str(exc).splitlines()[0]})"
        if frame is not None:
            missing = [c for c in ("step", "final") if c not in frame.columns]
            if not missing:
                return frame.to_dict("records")
            why = f"is not an evaluator's CSV (no {' or '.join(missing)} column)"
        raise ConfigError("csv", str(self.csv), f"{why}: give a new file, or one `downpour "
                                                "evaluate` wrote, which it continues")

    def poll(self) -> int:
        """Score every checkpoint not scored yet; how many were scored."""
        scored = 0
        for step, path in checkpoint.scan(self.directory):
            if step in self.scored:
                continue
            try:
                stat = path.stat()
            except FileNotFoundError:  # replaced or removed since the scan
                continue
            key = (path.name, stat.st_size, stat.st_mtime_ns)
            if key in self._bad:
                continue  # reported already; looked at again only if the file changes
            try:
                row = self.score(path)
            except (CheckpointError, DownpourError, RuntimeError, KeyError, ValueError) as exc:
                self._bad.add(key)
                self.report(f"skipping {path}: {exc}")
                continue
            self.rows.append(row)
            self.scored.add(row["step"])
            atomic_write_text(self.csv, pd.DataFrame(self.rows, columns=list(COLUMNS))
                              .sort_values("step").to_csv(index=False))
            self.log(f"step {row['step']}: test loss {row['loss']:.4f}, accuracy "
                     f"{row['accuracy']:.4f}{' (final)' if row['final'] else ''}")
            scored += 1
        return scored

    def score(self, path: Path) -> dict[str, Any]:
        state = checkpoint.load(path)
        config = state["config"]
        data_dir = self.data_dir or config.get("data_dir") or "data"
        key = (config["dataset"], data_dir)
        if key not in self._splits:
            self._splits[key] = load_dataset(config["dataset"], data_dir)
        splits = self._splits[key]
        model = build_model(config["model"], splits.train.input_shape, splits.train.num_classes)
        model.load_state_dict(state["model"])
        loss, accuracy = evaluate(model.to(self.device), splits.test, self.batch_size, self.device,
                                  samples=self.samples)
        return {"step": int(state["step"]), "final": bool(state["final"]),
                "time_s": float(state.get("time_s", float("nan"))),
                "wall_time": float(state.get("wall_time", float("nan"))),
                "evaluated_at": time.time(), "loss": loss, "accuracy": accuracy,
                "samples": len(eval_indices(len(splits.test), self.samples)), "file": path.name}

    def newest_is_final(self) -> bool:
        """Whether the newest checkpoint scored is its run's final one. A run resumed from a final
        checkpoint writes newer ones beside it, so an older final does not end a watch."""
        newest = max(self.rows, key=lambda r: int(r["step"]), default=None)
        return newest is not None and bool(newest["final"])

    def watch(self, poll_s: float = EVAL_POLL_S, until_step: int | None = None,
              timeout_s: float | None = None) -> str:
        """Poll until the final checkpoint (or ``until_step``) is scored, or ``timeout_s`` passes;
        why it stopped: "final", "until_step" or "timeout"; "final before" where that final
        checkpoint was there before the watch began (a finished run, or one not yet resumed)."""
        start = time.monotonic()
        there = {step for step, _ in checkpoint.scan(self.directory)}
        while True:
            self.poll()
            if self.newest_is_final():
                return "final before" if max(self.scored) in there else "final"
            if until_step is not None and any(s >= until_step for s in self.scored):
                return "until_step"
            if timeout_s is not None and time.monotonic() - start >= timeout_s:
                return "timeout"
            time.sleep(poll_s)


def run(directory: str, csv: str | None = None, watch: bool = False, poll_s: float = EVAL_POLL_S,
        until_step: int | None = None, timeout_s: float | None = None, device: str = "cpu",
        batch_size: int = Length.eval_batch_size, data_dir: str | None = None,
        samples: int = 0) -> str:
    """Score ``directory``'s checkpoints into ``csv`` (default: DIR/evals.csv), once or watching.
    Once: "once" if it scored any; if none, "scored before" if some are in the CSV already (the
    others, if any, were reported unreadable), "unreadable" if none is."""
    evaluator = Evaluator(Path(directory), Path(csv) if csv else Path(directory) / "evals.csv",
                          torch.device(device), batch_size, data_dir, samples=samples)
    if not watch:
        if evaluator.poll():
            return "once"
        present = {step for step, _ in checkpoint.scan(directory)}
        return "scored before" if present & evaluator.scored else "unreadable"
    return evaluator.watch(poll_s, until_step, timeout_s)
