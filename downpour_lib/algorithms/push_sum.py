"""Push-sum machinery shared by SGP and Overlap-SGP (a helper, not an algorithm).

Push-sum (Kempe et al., FOCS 2003) as used by Stochastic Gradient Push (Assran et al., ICML 2019):
each rank holds a numerator x_i and a weight w_i (1 at the start). A gossip step sends a share of
(x_i, w_i) to each out-peer and keeps the rest; a receiver adds what arrives. Since the shares of a
sender sum to one (column-stochastic mixing, ``mixing.py``), the sum over ranks of x_i, plus what
is in flight, never changes; the de-biased z_i = x_i / w_i converge to the average of the x's even
on a directed graph where plain averaging would be biased.

Where the values live: between steps the model's parameters hold z_i (what forward, backward and
evaluation see). ``to_numerators`` turns them into x_i just before the optimizer step, so the
update x_i <- x_i - lr * grad f(z_i) acts on the numerator (Algorithm 1 of the SGP paper); ``post``
sends the shares; ``absorb`` adds received ones; ``debias`` turns x_i back into z_i. The weight
travels as the last element of the one flat message per peer. SGP and Overlap-SGP differ only in
*when* they absorb, which is why this is a set of steps and not a class with a mode.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._utils import _unflatten_dense_tensors

from ..comm.collectives import Communicator, flatten, nbytes
from ..comm.p2p import Exchange
from ..mixing import uniform_weights
from ..topology import Topology


class PushSum:
    """One rank's push-sum state over ``params`` (the model's own parameter tensors)."""

    def __init__(self, params: list[torch.Tensor], topology: Topology, comm: Communicator,
                 rank: int) -> None:
        self.params, self.topology, self.comm, self.rank = params, topology, comm, rank
        self.weight = 1.0  # w_i; every rank starts from the same parameters, so z = x

    @torch.no_grad()
    def to_numerators(self) -> None:
        """z -> x = w z, so the optimizer's update is applied to the numerator."""
        if self.weight != 1.0:
            for p in self.params:
                p.mul_(self.weight)

    @torch.no_grad()
    def debias(self) -> None:
        """x -> z = x / w: the parameters the next forward pass and evaluation see."""
        if self.weight != 1.0:
            for p in self.params:
                p.div_(self.weight)

    def message_bytes(self) -> int:
        return sum(nbytes(p) for p in self.params) + self.params[0].element_size()

    @torch.no_grad()
    def post(self, step: int) -> Exchange:
        """Send this step's shares of (x, w) to the out-peers; keep our own share. Non-blocking:
        the in-peers' shares arrive in the returned exchange."""
        to = self.topology.out_peers(self.rank, step)
        receive_from = self.topology.in_peers(self.rank, step)
        keep, give = uniform_weights(len(to))
        weight = torch.tensor([self.weight], dtype=self.params[0].dtype,
                              device=self.params[0].device)
        flat = flatten([p.detach() for p in self.params] + [weight])
        posted = self.comm.exchange(flat * give, to, receive_from, tag=step)
        if to:
            for p in self.params:
                p.mul_(keep)
            self.weight *= keep
        return posted

    @torch.no_grad()
    def absorb(self, received: list[torch.Tensor]) -> None:
        """Add the in-peers' shares to x and w."""
        if not received:
            return
        total = received[0] if len(received) == 1 else torch.stack(received).sum(0)
        for p, share in zip(self.params, _unflatten_dense_tensors(total[:-1], self.params),
                            strict=True):
            p.add_(share)
        self.weight += float(total[-1])

    def state_dict(self) -> dict[str, Any]:
        return {"ps_weight": self.weight}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.weight = float(state["ps_weight"])

