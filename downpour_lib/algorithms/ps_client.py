"""A worker's end of the asynchronous parameter servers (Downpour SGD's client side, Dean et al.,
NIPS 2012, Algorithm 7.1), beside ``ps_server``, whose protocol it speaks.

``ShardClient`` holds what a worker keeps of every shard: the shard's tensors in its model, the
version of the parameters it last fetched, and the gradients it accumulated since its last push.
It pushes to every server at once and fetches from every server at once; a shard served on this
rank (colocated) is read and updated directly, under the shard's lock, without a message.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch

from ..comm.collectives import Communicator, flatten, unflatten_into
from ..comm.p2p import HEADER, header
from .ps_server import (
    DATA,
    DONE,
    FETCH,
    PUSH,
    PUSH_DATA,
    REPLY,
    REQUEST,
    VERSION,
    ShardServer,
    from_bytes,
)

Tensors = list[torch.Tensor]


class ShardClient:
    """One worker's view of the shards: ``shards[s]`` is shard ``s``'s (parameters, buffers) in
    the worker's model, served by rank ``servers[s]`` (``local`` when that is this rank)."""

    def __init__(self, link: Communicator, rank: int, servers: Sequence[int],
                 shards: list[tuple[Tensors, Tensors]], local: ShardServer | None,
                 device: torch.device, dtype: torch.dtype) -> None:
        self.link, self.rank, self.servers, self.shards = link, rank, tuple(servers), shards
        self.local, self.device, self.dtype = local, device, dtype
        self.versions = [0] * len(servers)  # of the parameters this worker last fetched
        # the gradients summed between pushes, on the worker's device: a push copies them to the
        # host once, where a host-side sum copied every step's (on an H200, resnet50 bf16 at
        # n_push 4: 0.078 s a step, more than the step's 0.055 s of compute)
        self.acc = [torch.zeros(self.numel(s), dtype=self.dtype, device=device)
                    for s in range(len(servers))]
        self.acc_version: list[int] | None = None  # versions the oldest accumulated gradient saw
        self.stop_heard = False  # a server said the run is stopping (preemption)

    def numel(self, s: int) -> int:
        return sum(t.numel() for t in [*self.shards[s][0], *self.shards[s][1]])

    def remote(self, s: int) -> bool:
        """Whether shard ``s`` is reached by message (it lives on another rank)."""
        return self.servers[s] != self.rank

    # -- gradients out ----------------------------------------------------------------------------

    def accumulate(self, skip: bool) -> None:
        """Add this step's gradients to every shard's sum (``skip``: this step adds nothing, as
        an fp16 step that overflowed here); the sum remembers the versions it started from."""
        if self.acc_version is None:
            self.acc_version = list(self.versions)
        for s, (params, _) in enumerate(self.shards):
            if skip:
                break
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
            if grads:
                self.acc[s][:sum(g.numel() for g in grads)] += flatten(grads)

    def push(self, step: int, bounded: bool) -> tuple[dict[str, float], bool]:
        """Push every shard's accumulated gradients (and current buffers) to its server, all
        servers at once; each receipt carries the push's staleness. The step's numbers, and
        whether a server refused a push as too stale (``bounded``: staleness is bounded, so
        the refusals are counted), after which the worker fetches before its next step."""
        staleness: dict[int, int] = {}
        refused: list[int] = []
        works, receipts = [], {}
        for s, server in enumerate(self.servers):
            flat = self.acc[s].to("cpu", copy=True)
            buffers = self.shards[s][1]
            if buffers:
                flat[flat.numel() - sum(b.numel() for b in buffers):] = flatten(buffers).cpu()
            if not self.remote(s):
                _, staleness[s], _, applied = self.local.apply(flat, self.acc_version[s], step)
                if not applied:
                    refused.append(s)
                continue
            receipts[s] = torch.empty(HEADER, dtype=torch.int64)
            works += [self.link.irecv(receipts[s], server, REPLY),
                      self.link.isend(header(PUSH, self.acc_version[s], step), server, REQUEST),
                      self.link.isend(flat, server, PUSH_DATA)]
        self.link.wait(works, account="wait")  # mostly the server's queue: waiting
        staleness.update({s: int(r[1]) for s, r in receipts.items()})
        refused += [s for s, r in receipts.items() if not int(r[3])]
        for a in self.acc:
            a.zero_()
        self.acc_version = None
        # the staleness of what was applied (a refused shard's is left out: nan)
        values = [math.nan if s in refused else float(staleness[s]) for s in range(len(self.servers))]
        applied = [v for v in values if not math.isnan(v)]
        pushed = {"staleness": sum(applied) / len(applied) if applied else math.nan,
                  "staleness_max": max(applied) if applied else math.nan}
        if len(values) > 1:
            pushed.update({f"staleness_shard{s}": v for s, v in enumerate(values)})
        if bounded:
            pushed["refused"] = float(len(refused))
        return pushed, bool(refused)

    # -- parameters in ----------------------------------------------------------------------------

    def fetch(self, account: Literal["comm", "wait"] = "comm") -> None:
        """Every shard's current parameters (and buffers) into this worker's model."""
        works, remote = [], []
        for s, server in enumerate(self.servers):
            out = torch.empty(self.numel(s), dtype=self.dtype)
            if not self.remote(s):
                self.versions[s] = self.local.read(out)
                self.install(s, out)
                continue
            reply = torch.empty(HEADER, dtype=torch.int64)
            works += [self.link.irecv(reply, server, REPLY),
                      self.link.irecv(out, server, DATA),
                      self.link.isend(header(FETCH), server, REQUEST)]
            remote.append((s, reply, out))
        self.link.wait(works, account)
        for s, reply, out in remote:
            self.versions[s] = int(reply[0])
            self.stop_heard |= bool(int(reply[1]))
            self.install(s, out)

    def install(self, s: int, flat: torch.Tensor) -> None:
        params, buffers = self.shards[s]
        with torch.no_grad():
            unflatten_into(flat.to(self.device), [*params, *buffers])

    def install_states(self, states: list[dict[str, Any]]) -> None:
        """Every shard's state (a snapshot's) into this worker's model, at its version."""
        for s, state in enumerate(states):
            self.install(s, flatten([*state["params"], *state["buffers"]]))
            self.versions[s] = int(state["version"])

    def warmstart(self, warm: int) -> None:
        """Wait until server 0's version reaches ``warm`` (the first worker's pushes alone moved
        the parameters: its pushes are the only ones until then), or the run is stopping.
        Asking again every few milliseconds keeps the server stateless (a colocated server 0
        applies the first worker's pushes directly, without a message that could wake a
        waiting list)."""
        while warm:
            reply = torch.empty(HEADER, dtype=torch.int64)
            self.link.wait([self.link.irecv(reply, self.servers[0], REPLY),
                            self.link.isend(header(VERSION), self.servers[0], REQUEST)])
            if int(reply[0]) >= warm or int(reply[1]):  # warm, or the run is stopping
                self.stop_heard |= bool(int(reply[1]))
                break
            time.sleep(0.005)

    # -- the end and checkpoints ------------------------------------------------------------------

    def snapshots(self, kind: int, stopping: bool,
                  settle_local: Callable[[], None] = lambda: None) -> list[dict[str, Any]]:
        """Every shard's full state (SNAPSHOT: now; FINAL: once every worker is done);
        ``settle_local`` runs before the local shard is read (the FINAL of a colocated shard is
        its state once its loop has ended)."""
        states: list[dict[str, Any] | None] = [None] * len(self.servers)
        for s, server in enumerate(self.servers):
            if not self.remote(s):
                continue
            reply = torch.empty(HEADER, dtype=torch.int64)
            self.link.wait([self.link.irecv(reply, server, REPLY),
                            self.link.isend(header(kind, int(stopping)), server, REQUEST)])
            data = torch.empty(int(reply[0]), dtype=torch.uint8)
            self.link.recv(data, server, DATA)
            states[s] = from_bytes(data)
        for s in range(len(self.servers)):
            if not self.remote(s):
                settle_local()
                states[s] = self.local.state_dict()
        return states  # type: ignore[return-value]

    def done(self, stopping: bool) -> None:
        """Tell every remote server this worker has pushed for the last time (and whether it
        stopped early, which the servers pass on to the other workers)."""
        for s, server in enumerate(self.servers):
            if self.remote(s):
                self.link.send([header(DONE, int(stopping))], server, REQUEST)
