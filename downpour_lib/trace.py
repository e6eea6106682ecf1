"""A timeline of a run: every rank's steps as Chrome trace events (``downpour train --trace DIR``).

What Horovod's timeline is for its allreduces, for every algorithm here: each worker's step split
into data, forward and backward, and the update (the algorithm's hooks and the optimizer), with the
communication the step's meter times inside them (a synchronous collective, the wait for the
buckets backward did not hide, a push, a fetch, a gossip exchange: ``Meter.timed``) and, on a track
of their own, each gradient bucket's allreduce from launch to completion, so the overlap with
backward shows. Server ranks show each update they apply. The step spans are the step record's own
marks, so their lengths are the record's ``data_s``, ``step_s`` and so on.

Every rank's clock starts at the run's common start (the barrier before the first step), so the
ranks line up. On a GPU the step's marks are the device's (CUDA events, ``records.StepClock``), and
so is a bucket's launch: when the device reached it, its gradients made, not when the host queued
it, which runs ahead of the device (``Tracer.launch``, converted at the step's end). Rank 0
gathers the events with the records and writes one file, ``DIR/trace.json`` (Chrome's JSON trace
format): open it at https://ui.perfetto.dev (or chrome://tracing); one process per rank. About 50
bytes per event: a few hundred steps of a few ranks is a few MB.

With tracing off nothing is recorded and the meter pays one attribute test per timed block.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .checkpoint import atomic_write_text

#: The tracks (Chrome trace "threads") of a rank, in the order a viewer shows them.
TRACKS = {"step": 0, "comm": 1, "buckets": 2, "server": 3}


class Tracer:
    """One rank's events. Recorded in ``time.perf_counter()`` seconds; ``export`` puts them on the
    run's clock, microseconds since ``t0`` (the common start), leaving out what came before it
    (setting up)."""

    def __init__(self, rank: int, t0: float | None = None) -> None:
        self.rank, self.t0 = rank, time.perf_counter() if t0 is None else t0
        self.spans: list[tuple[str, float, float, str, dict[str, Any]]] = []
        self.pending: deque = deque()  # spans whose start is a CUDA event, not yet converted
        self.reference: tuple[Any, float] | None = None  # the last (event, its host time)

    def span(self, name: str, start: float, end: float, track: str = "step",
             **args: Any) -> None:
        """A complete event from ``start`` to ``end`` (perf_counter seconds). Safe from any thread
        (appending to a list is atomic)."""
        self.spans.append((name, start, end, track, args))

    def launch(self, name: str, start: float, on_device: Any, end: float, track: str = "step",
               **args: Any) -> None:
        """A span from a launch to ``end`` (perf_counter seconds): from where the device reached
        ``on_device`` (a recorded ``torch.cuda.Event``, ``records.device_mark``), put on the host's
        clock by the next ``on_device_clock``; without one (the CPU), from the host's ``start``.
        Safe from any thread."""
        if on_device is None:
            self.span(name, start, end, track, **args)
        else:
            self.pending.append((name, on_device, end, track, args))

    def on_device_clock(self, event: Any, host_s: float) -> None:
        """Convert the pending device starts against ``event``, recorded when the device was idle
        at ``host_s`` (a step's start mark): what each started event's elapsed time from it
        says, after the step's synchronisation (every event recorded so far has happened)."""
        self.reference = (event, host_s)
        while self.pending:
            name, started, end, track, args = self.pending.popleft()
            start = host_s + event.elapsed_time(started) / 1000
            self.spans.append((name, start, max(start, end), track, args))

    def export(self) -> list[dict[str, Any]]:
        """The spans as Chrome trace events of this rank (process ``rank``, a thread per track)."""
        if self.pending and self.reference is not None:  # completed after the last step's end
            self.on_device_clock(*self.reference)
        events = []
        for name, start, end, track, args in list(self.spans):
            if start < self.t0:
                continue
            event = {"name": name, "ph": "X", "pid": self.rank, "tid": TRACKS[track],
                     "ts": round((start - self.t0) * 1e6, 1),
                     "dur": round(max(0.0, end - start) * 1e6, 1)}
            if args:
                event["args"] = args
            events.append(event)
        return events

    @contextmanager
    def timed(self, name: str, track: str = "step", **args: Any) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.span(name, start, time.perf_counter(), track, **args)


def write(path: str | os.PathLike, parts: Sequence[tuple[int, str, list[dict[str, Any]]]]) -> Path:
    """One trace of every rank: ``parts`` are (rank, label, events); atomically written."""
    events: list[dict[str, Any]] = []
    for rank, label, part in parts:
        events.append({"name": "process_name", "ph": "M", "pid": rank, "args": {"name": label}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": rank,
                       "args": {"sort_index": rank}})
        for track, tid in TRACKS.items():
            events.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid,
                           "args": {"name": track}})
        events.extend(part)
    path = Path(path)
    atomic_write_text(path, json.dumps({"traceEvents": events, "displayTimeUnit": "ms"},
                                       separators=(",", ":")))
    return path


def load(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The complete events ("X") of a trace written by ``write``."""
    return [e for e in json.loads(Path(path).read_text())["traceEvents"] if e["ph"] == "X"]
