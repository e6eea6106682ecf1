"""The record schema: what every run measures, and how a run becomes one tidy row.

A step is timed into five disjoint parts (their sum is the step's wall time):

- ``data_s``: reading the batch and moving it to the device;
- ``compute_s``: forward and backward, minus communication that backward could not hide;
- ``comm_s``: time inside communication calls (for DDP-style overlap, only the exposed part);
- ``wait_s``: time blocked on another rank's progress (a server waiting for gradients, a worker
  waiting for the server's update);
- ``update_s``: the rest of the algorithm's work: optimizer step, packing, copying.

Bytes are counted per rank as the algorithm's logical traffic (a parameter-server worker sends one
gradient and receives one parameter vector per step; a ring allreduce moves 2(N-1)/N of the buffer
each way), not what a particular backend's internal tree happens to move.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

# pandas where a frame is made (on rank 0, at the end of a run), torch where a rank times or syncs
# a device: a study's planner reads the records' names and columns, and imports neither
if TYPE_CHECKING:
    import pandas as pd
    import torch


def device_sync(device: torch.device) -> None:
    """Wait for queued GPU work, so host timers measure it (a no-op on CPU)."""
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def _cpu() -> torch.device:
    import torch

    return torch.device("cpu")


class StepClock:
    """The marks of a worker's step: start, data ready, forward done, backward done, end (host
    seconds). ``end()`` returns all but the forward's, which ``forward_end`` holds (the trace's
    split of forward and backward; the records need only their sum).

    On the CPU they are host times. On a GPU the middle ones are CUDA events, converted after the
    end mark's one synchronisation (which the step needs anyway to read its loss): timing adds no
    stall of the device's queue inside the step. The device is idle at the start mark (the last
    step ended synchronised), so the events' elapsed times add up from the start's host time."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.cuda = device, device.type == "cuda"
        import torch

        self.events = [torch.cuda.Event(enable_timing=True) for _ in range(4)] if self.cuda else []
        self.t = [0.0, 0.0, 0.0, 0.0]  # start, data ready, backward done, forward done

    def _mark(self, i: int) -> None:
        if self.cuda:
            self.events[i].record()
        else:
            self.t[i] = time.perf_counter()

    def start(self) -> None:
        self.t[0] = time.perf_counter()
        if self.cuda:
            self.events[0].record()

    def data_ready(self) -> None:
        self.host_data_ready = time.perf_counter()
        self._mark(1)

    def forward_done(self) -> None:
        self._mark(3)

    def backward_done(self) -> None:
        self._mark(2)

    def device_origin(self) -> tuple[Any, float] | None:
        """On a GPU, the step's start event and its host time (valid after ``end()``): what converts
        another event of this step to the host's clock (``Tracer.on_device_clock``); else None."""
        return (self.events[0], self.t[0]) if self.cuda else None

    @property
    def forward_end(self) -> float:
        """The forward's end, valid after ``end()``."""
        return self.t[3]

    def end(self) -> tuple[float, float, float, float]:
        if self.cuda:
            device_sync(self.device)
            e0, e1, e2, e3 = self.events
            self.t[1] = self.t[0] + e0.elapsed_time(e1) / 1000
            self.t[2] = self.t[1] + e1.elapsed_time(e2) / 1000
            self.t[3] = self.t[1] + e1.elapsed_time(e3) / 1000
        return self.t[0], self.t[1], self.t[2], time.perf_counter()


def device_mark(tensor: torch.Tensor) -> Any:
    """A CUDA event recorded now on the current stream where ``tensor`` is on a GPU (when the
    device gets there, the kernels that made it have run), else None."""
    if not tensor.is_cuda:
        return None
    import torch

    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


@dataclass
class Meter:
    """Accumulates one step's communication time and bytes; the algorithm fills it, the engine reads it."""

    device: torch.device = field(default_factory=_cpu)
    comm_s: float = 0.0
    wait_s: float = 0.0
    exposed_backward_comm_s: float = 0.0  # comm that overlapped backward but was not hidden by it
    bytes_sent: int = 0
    bytes_received: int = 0
    tracer: Any = field(default=None, repr=False)  # trace.Tracer: timed blocks become spans

    def reset(self) -> None:
        self.comm_s = self.wait_s = self.exposed_backward_comm_s = 0.0
        self.bytes_sent = self.bytes_received = 0

    @contextmanager
    def timed(self, account: Literal["comm", "wait"], label: str | None = None) -> Iterator[None]:
        """Time the block into ``account``; traced, it is a span named ``label`` (or the account)."""
        device_sync(self.device)
        start = time.perf_counter()
        try:
            yield
        finally:
            device_sync(self.device)
            end = time.perf_counter()
            if account == "comm":
                self.comm_s += end - start
            else:
                self.wait_s += end - start
            if self.tracer is not None:
                self.tracer.span(label or account, start, end, "comm", account=account)

    def count(self, sent: int = 0, received: int = 0) -> None:
        self.bytes_sent += int(sent)
        self.bytes_received += int(received)


@dataclass(frozen=True)
class StepRecord:
    """One rank's one step (or, for a server, one applied update)."""

    rank: int
    role: Literal["worker", "server"]
    step: int
    epoch: int
    samples: int
    loss: float
    data_s: float
    compute_s: float
    comm_s: float
    wait_s: float
    update_s: float
    step_s: float
    bytes_sent: int
    bytes_received: int
    time_s: float  # seconds since the run's common start, at the end of the step
    extras: dict[str, float] = field(default_factory=dict)  # the algorithm's own (e.g. staleness)


@dataclass(frozen=True)
class EvalRecord:
    """An evaluation on the test split of what the algorithm says to evaluate."""

    rank: int
    step: int
    time_s: float
    loss: float
    accuracy: float
    samples: int
    extras: dict[str, float] = field(default_factory=dict)  # e.g. consensus_distance


@dataclass
class RunResult:
    """What rank 0 returns: every step and evaluation of every rank, and the one-row summary."""

    config: dict[str, Any]
    steps: pd.DataFrame
    evals: pd.DataFrame
    summary: dict[str, Any]

    def summary_frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame([self.summary])

    def write_summary_json(self, path: str) -> None:
        from .checkpoint import atomic_write_text

        atomic_write_text(path, json.dumps({**self.summary, "config": self.config}, indent=2,
                                           default=str) + "\n")


def _rows(records: list) -> list[dict[str, Any]]:
    """Flatten each record's ``extras`` into columns of its own."""
    rows = []
    for record in records:
        row = asdict(record)
        extras = row.pop("extras")  # popped first: ``{**row, **row.pop(...)}`` would keep it
        rows.append({**row, **extras})
    return rows


def frames(steps: list[StepRecord], evals: list[EvalRecord]) -> tuple[pd.DataFrame, pd.DataFrame]:
    import pandas as pd

    step_cols = [c for c in StepRecord.__dataclass_fields__ if c != "extras"]
    eval_cols = [c for c in EvalRecord.__dataclass_fields__ if c != "extras"]
    step_frame, eval_frame = pd.DataFrame(_rows(steps)), pd.DataFrame(_rows(evals))
    return (step_frame if len(step_frame) else pd.DataFrame(columns=step_cols),
            eval_frame if len(eval_frame) else pd.DataFrame(columns=eval_cols))


TIME_PARTS = ("data_s", "compute_s", "comm_s", "wait_s", "update_s")


def summarize(steps: pd.DataFrame, evals: pd.DataFrame, warmup_steps: int) -> dict[str, Any]:
    """The run's metrics. Throughput sums each worker's own rate over its post-warm-up steps, which
    is right for synchronous algorithms (all rates equal) and for asynchronous ones (no common clock)."""
    workers = steps[steps.role == "worker"]
    measured = workers[workers.step >= warmup_steps]
    if measured.empty:
        measured = workers
    per_rank = measured.groupby("rank")[["samples", "step_s"]].sum()
    rates = per_rank.samples / per_rank.step_s.where(per_rank.step_s > 0)
    # final train loss: the mean over the last 10% of steps (at least one), over all workers
    total = int(workers.step.max()) + 1 if len(workers) else 0
    last_steps = workers[workers.step >= total - max(1, math.ceil(0.1 * total))]
    out: dict[str, Any] = {
        "num_workers": int(workers["rank"].nunique()),
        "measured_steps": int(measured.step.nunique()),
        "samples_per_s": float(rates.sum()) if len(rates) else float("nan"),
        "step_s": float(measured.groupby("rank").step_s.mean().mean()),
        **{part: float(measured.groupby("rank")[part].mean().mean()) for part in TIME_PARTS},
        "bytes_sent_per_step": float(measured.groupby("rank").bytes_sent.mean().mean()),
        "bytes_received_per_step": float(measured.groupby("rank").bytes_received.mean().mean()),
        "final_train_loss": float(last_steps.loss.mean()),
        "test_loss": float("nan"),
        "test_accuracy": float("nan"),
    }
    if not evals.empty:
        last = evals.sort_values(["step", "time_s"]).iloc[-1]
        out["test_loss"], out["test_accuracy"] = float(last.loss), float(last.accuracy)
    if staleness_columns(workers):
        out.update(staleness_summary(steps))
    if "consensus_distance" in evals:
        out.update(consensus_summary(evals))
    return out


def staleness_columns(steps: pd.DataFrame) -> list[str]:
    """Where the records keep staleness: one column per parameter shard (Downpour's pushes), or
    one ``staleness`` column (the gossip algorithms' lag)."""
    return [c for c in steps.columns if c.startswith("staleness_shard")] or \
        [c for c in ("staleness",) if c in steps.columns]


def staleness_summary(steps: pd.DataFrame) -> dict[str, Any]:
    """Mean and max of the workers' staleness records (one value per push and shard for
    Downpour, per step for the gossip algorithms), and their histogram ({staleness: count}) when
    they are whole numbers of updates."""
    import pandas as pd

    workers = steps[steps.role == "worker"] if "role" in steps else steps
    columns = staleness_columns(workers)
    values = pd.concat([workers[c] for c in columns]).dropna() if columns else pd.Series([])
    if values.empty:
        return {"staleness_mean": float("nan"), "staleness_max": float("nan"), "staleness_hist": {}}
    whole = bool((values == values.round()).all())
    out = {"staleness_mean": float(values.mean()),
           "staleness_max": int(values.max()) if whole else float(values.max())}
    if whole:
        counts = values.astype(int).value_counts().sort_index()
        out["staleness_hist"] = {str(k): int(v) for k, v in counts.items()}
    return out


def consensus_summary(evals: pd.DataFrame) -> dict[str, Any]:
    """How far apart the workers' models were at the last evaluation (the gossip algorithms)."""
    last = evals.sort_values(["step", "time_s"]).consensus_distance.iloc[-1] if len(evals) else math.nan
    return {"final_consensus_distance": float(last)}
