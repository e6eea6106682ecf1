"""One asynchronous parameter-server shard and the loop that serves it (Downpour SGD's server side,
Dean et al., NIPS 2012, "Large Scale Distributed Deep Networks").

The server applies each push the moment it is received, in arrival order, with the configured
optimizer (Adagrad by default, as in the paper) and counts its updates in a version number. The
staleness of an update is the server's version when it applies the push minus the version of the
parameters the pushed gradient was computed from.

The protocol (fixed layouts; ``p2p.HEADER`` int64 slots per header):

    worker -> server  REQUEST  (kind, version, 0, 0); a PUSH is followed by PUSH_DATA: the shard's
                      accumulated gradients, then its buffers, as one flat tensor
    server -> worker  REPLY    PUSH:  (version before, staleness, version after, applied), the receipt
                               FETCH: (version, stopping, 0, 0), then DATA: the shard's parameters
                               and buffers; stopping = 1 once the run is being preempted
                               SNAPSHOT / FINAL: (bytes, version, 0, 0), then DATA: torch.save'd
                               shard state (parameters, buffers, optimizer state, version)
                               VERSION: (version, stopping, 0, 0); the warmstart (Dean et al. let one
                               replica train alone before "unleashing" the others) asks until the
                               first worker's pushes have moved the version far enough
                               EXCHANGE: (version, stopping, 0, 0), then DATA: the shard as it was
                               before the push that came with the request, which is then applied
                               (asynchronous EASGD's elastic exchange, ``easgd_async``)

    DONE and FINAL (kind, stopped early, 0, 0) say the worker has pushed for the last time (and
    whether it stopped early, for a preemption, which the server passes on); a FINAL is answered once every
    worker is done, which is how the evaluator gets the final parameters. The loop ends when every
    worker is done, so every push is applied (and acknowledged) before a server stops.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ..comm.collectives import Communicator, flatten, unflatten_into
from ..comm.p2p import HEADER, header

PUSH, FETCH, SNAPSHOT, DONE, FINAL, VERSION, EXCHANGE = 1, 2, 3, 4, 5, 6, 7
REQUEST, PUSH_DATA, REPLY, DATA = 101, 102, 103, 104  # message tags


def to_bytes(state: dict[str, Any]) -> torch.Tensor:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def from_bytes(data: torch.Tensor) -> dict[str, Any]:
    return torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=True)


class ShardServer:
    """A shard's own copy of its parameters and buffers, its optimizer and its version.

    Colocated, the server loop (a thread) and the rank's worker both touch the shard, so every
    access holds ``lock``."""

    def __init__(self, index: int, params: Sequence[torch.Tensor], buffers: Sequence[torch.Tensor],
                 make_optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
                 lr_at: Callable[[int], float] | None = None,
                 max_staleness: int | None = None) -> None:
        self.index = index
        self.params = [nn.Parameter(p.detach().clone()) for p in params]
        self.buffers = [b.detach().clone() for b in buffers]
        self.optimizer = make_optimizer(self.params)
        self.lr_at = lr_at  # the run's schedule, at the step of the push applied
        self.max_staleness = max_staleness  # a staler push is refused (bounded staleness)
        self.version = 0
        self.numel = sum(t.numel() for t in [*self.params, *self.buffers])
        self.dtype = (self.params or self.buffers)[0].dtype
        self.lock = threading.Lock()

    def apply(self, flat: torch.Tensor, version: int, step: int) -> tuple[int, int, int, int]:
        """Apply one push (gradients, then buffer values) that a worker made at its ``step``
        (whose learning rate it gets) from the parameters at ``version``: (version before,
        staleness, version after, 1), or (version, staleness, version, 0) if the push is staler
        than ``max_staleness`` and refused."""
        with self.lock:
            if self.max_staleness is not None and self.version - version > self.max_staleness:
                return self.version, self.version - version, self.version, 0
            if self.lr_at is not None:
                for group in self.optimizer.param_groups:
                    group["lr"] = self.lr_at(step)
            for p in self.params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            # Buffers (batch-norm statistics) are not gradients: the latest push's values win.
            unflatten_into(flat, [p.grad for p in self.params] + self.buffers)
            self.optimizer.step()
            before = self.version
            self.version += 1
            return before, before - version, self.version, 1

    def read(self, out: torch.Tensor) -> int:
        """Copy the parameters and buffers into ``out``; the version they are at."""
        with self.lock:
            out.copy_(flatten([p.detach() for p in self.params] + self.buffers))
            return self.version

    def state_dict(self) -> dict[str, Any]:
        with self.lock:
            return {"shard": self.index, "version": self.version,
                    "params": [p.detach().clone() for p in self.params],
                    "buffers": [b.clone() for b in self.buffers],
                    "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self.lock, torch.no_grad():
            for dst, src in zip([*self.params, *self.buffers],
                                [*state["params"], *state["buffers"]], strict=True):
                dst.copy_(src)
            self.optimizer.load_state_dict(state["optimizer"])
            self.version = int(state["version"])


class ServeLoop:
    """Serves one shard to the workers that reach it by message, until every one is done.

    ``on_update(source, staleness)`` runs after each applied push (the engine's server records).
    ``local_done``, on a colocated rank, is set by the rank's own worker (which uses the shard
    directly, not by message) when it has pushed for the last time.

    Preemption: once the server has the ``signal`` itself, or a worker stopped early (its DONE or
    FINAL says so), ``stopping`` is set and every FETCH and VERSION reply carries it, so each
    worker stops at its next step."""

    def __init__(self, server: ShardServer, link: Communicator, workers: Sequence[int],
                 on_update: Callable[[int, int], None] | None = None,
                 local_done: threading.Event | None = None, signal: Any = None) -> None:
        self.server, self.link, self.workers = server, link, set(workers)
        self.on_update, self.local_done, self.signal = on_update, local_done, signal
        self.stopping = False

    def _stopping(self) -> int:
        self.stopping |= self.signal is not None and self.signal.requested()
        return int(self.stopping)

    def run(self) -> None:
        server, link = self.server, self.link
        request = torch.empty(HEADER, dtype=torch.int64)
        push = torch.empty(server.numel, dtype=server.dtype)
        out = torch.empty(server.numel, dtype=server.dtype)
        done: set[int] = set()
        finals: list[int] = []
        while not self.workers <= done:
            source = link.recv_any(request, REQUEST, account="wait")
            kind, version = int(request[0]), int(request[1])
            if kind == PUSH:
                link.recv(push, source, PUSH_DATA)
                before, staleness, after, applied = server.apply(push, version, int(request[2]))
                link.send([header(before, staleness, after, applied)], source, REPLY)
                if applied and self.on_update is not None:
                    self.on_update(source, staleness)
            elif kind == VERSION:
                link.send([header(server.version, self._stopping())], source, REPLY)
            elif kind == FETCH:
                version = server.read(out)
                link.send([header(version, self._stopping())], source, REPLY)
                link.send([out], source, DATA)
            elif kind == EXCHANGE:  # the push's partner gets the shard from before it
                link.recv(push, source, PUSH_DATA)
                version = server.read(out)
                link.send([header(version, self._stopping())], source, REPLY)
                link.send([out], source, DATA)
                _, staleness, _, applied = server.apply(push, int(request[1]), int(request[2]))
                if applied and self.on_update is not None:
                    self.on_update(source, staleness)
            elif kind == SNAPSHOT:
                self._send_snapshot(source)
            elif kind in (DONE, FINAL):
                done.add(source)
                self.stopping |= bool(version)  # the worker stopped early: a preemption
                if kind == FINAL:
                    finals.append(source)  # answered once every worker is done
            else:
                raise RuntimeError(f"parameter server {server.index}: unknown request kind {kind} "
                                   f"from rank {source}")
        if self.local_done is not None:
            self.local_done.wait()
        for source in finals:
            self._send_snapshot(source)

    def _send_snapshot(self, dst: int) -> None:
        data = to_bytes(self.server.state_dict())
        self.link.send([header(data.numel(), self.server.version)], dst, REPLY)
        self.link.send([data], dst, DATA)


class ServerThread:
    """A colocated rank's server loop, in a thread beside the rank's worker (so a worker that is
    computing, or slow, still answers the others). Explicit ``start``/``join``; an error in the
    loop is kept and raised again in the worker's thread by ``check`` and ``join``."""

    def __init__(self, loop: ServeLoop) -> None:
        self.loop = loop
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="downpour-server", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.loop.run()
        except BaseException as exc:  # noqa: BLE001 -- handed to the worker thread, not swallowed
            self._error = exc

    def check(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"parameter server {self.loop.server.index} failed") from self._error

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.check()
