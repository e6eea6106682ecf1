"""How a run shows its progress: a tqdm bar on a terminal, and lines in a batch log.

Under ``mpiexec`` or ``srun`` rank 0's output is a pipe or a file, never a terminal, so a bar
would be hidden and the job would look hung until its summary. There the reporting rank prints a
line now and then instead, as training libraries do in batch logs (Keras' ``verbose=2``,
DeepSpeed's ``steps_per_print``): the step, the throughput, the last loss and the time left.

A line is due after every tenth of the run's steps and at least every ``MAX_GAP_S`` seconds (a
long run's tenth can take an hour), but never within ``MIN_GAP_S`` of the last one (a short run
need not print ten lines in a second); the last step always has its line.
"""

from __future__ import annotations

import math
import sys
import time
from typing import TextIO

from tqdm import tqdm

MAX_GAP_S = 30.0
MIN_GAP_S = 1.0


def _clock(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class ProgressLines:
    """Progress as lines of text: ``step k of N (p%)``, samples/s, loss, elapsed and left.

    ``samples_per_step`` is the global batch (every worker's), so samples/s is the run's
    throughput as the reporting rank sees its own steps go by (for asynchronous algorithms,
    whose workers do not step together, an estimate)."""

    def __init__(self, total: int, initial: int, desc: str, samples_per_step: int,
                 out: TextIO | None = None) -> None:
        self.total, self.step, self.start_step = total, initial, initial
        self.desc, self.samples_per_step = desc, samples_per_step
        self.out = out if out is not None else sys.stderr
        self.every = max(1, math.ceil((total - initial) / 10))
        self.loss = float("nan")
        self.t0 = self.last_t = None
        self.last_step = initial

    def start(self) -> None:
        """The clock starts with the first step (after set-up and the first barrier)."""
        self.t0 = self.last_t = time.perf_counter()

    def update(self, n: int = 1) -> None:
        if self.t0 is None:
            self.start()
        self.step += n
        now = time.perf_counter()
        since = now - self.last_t
        due = (self.step - self.last_step >= self.every or since >= MAX_GAP_S)
        if self.step >= self.total or (due and since >= MIN_GAP_S):
            self._print(now)

    def set_loss(self, loss: float) -> None:
        self.loss = loss

    def _print(self, now: float) -> None:
        # the rate since the last line: the first steps' start-up (data workers, first
        # collectives) would otherwise weigh on every estimate of time left
        done, elapsed = self.step - self.last_step, now - self.last_t
        rate = done / elapsed if elapsed > 0 else float("nan")
        left = (self.total - self.step) / rate if rate > 0 else float("nan")
        loss = f", loss {self.loss:.4f}" if math.isfinite(self.loss) else ""
        print(f"downpour: {self.desc}: step {self.step} of {self.total} "
              f"({100 * self.step / self.total:.0f}%), "
              f"{rate * self.samples_per_step:.1f} samples/s{loss}, "
              f"{_clock(now - self.t0)} elapsed, {_clock(left)} left", file=self.out, flush=True)
        self.last_t, self.last_step = now, self.step

    def close(self) -> None:
        pass


class ProgressBar:
    """tqdm's bar, on a terminal."""

    def __init__(self, total: int, initial: int, desc: str, show: bool) -> None:
        self.bar = tqdm(total=total, initial=initial, disable=not show, desc=desc)

    def start(self) -> None:
        pass

    def update(self, n: int = 1) -> None:
        self.bar.update(n)

    def set_loss(self, loss: float) -> None:
        self.bar.set_postfix(loss=f"{loss:.3f}", refresh=False)

    def close(self) -> None:
        self.bar.close()


def progress(total: int, initial: int, desc: str, samples_per_step: int, show: bool,
             lines: bool) -> ProgressBar | ProgressLines:
    """On the rank that reports (``show``): a bar if its stderr is a terminal, else lines if
    ``lines`` (the command line's runs, whose output goes to a batch log). Elsewhere nothing."""
    if show and not sys.stderr.isatty() and lines:
        return ProgressLines(total, initial, desc, samples_per_step)
    return ProgressBar(total, initial, desc, show and sys.stderr.isatty())
