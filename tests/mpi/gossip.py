"""Under mpiexec -n 4: the gossip algorithms against exact references (trained on digits: digits.py).

Mixing cases start every rank from different parameters and apply zero gradients, so only gossip
moves them. Each prints one JSON line from rank 0 with what the test asserts on:

- ``mass_rel_err``: max over steps of |sum_i w_i z_i - sum_i x_i(0)| / |sum_i x_i(0)| (push-sum's
  invariant; Overlap-SGP's numerators include what is in flight to them; AD-PSGD's is checked
  after ``close`` only), and at the end;
- ``reference_err``: max over ranks of |z_i - (P_T ... P_1 x(0))_i|, P_t from
  ``mixing.mixing_matrix``; ``mean_err``: the same against the exact average of x(0);
- ``distances``: the consensus distance (``metrics``) after each step, index 0 = start;
  ``raw_distances``: the same for the parameters as they are (for Overlap-SGP, nothing in flight
  included).

Exits non-zero on any exception.
"""

import json
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from downpour_lib import runtime
from downpour_lib.algorithms import make_algorithm
from downpour_lib.comm.collectives import flatten
from downpour_lib.comm.gossip import consensus_distance
from downpour_lib.mixing import mixing_matrix


def all_sum(t: torch.Tensor) -> torch.Tensor:
    t = t.clone()
    dist.all_reduce(t)
    return t


def gather_rows(flat: torch.Tensor, n: int) -> np.ndarray:
    rows = [torch.empty_like(flat) for _ in range(n)]
    dist.all_gather(rows, flat)
    return torch.stack(rows).double().numpy()


def worst(value: float) -> float:
    """The largest ``value`` over ranks (rank 0 reports for everyone)."""
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def mass(algorithm, name: str, params) -> torch.Tensor | None:
    """Sum over ranks of this rank's numerator (w_i z_i); what push-sum conserves. Overlap-SGP's
    includes the messages in flight to the rank. None where it is not conserved mid-round."""
    if name == "adpsgd":  # a pair's two halves of an average land at different moments
        return None
    if name == "osgp":
        z, w = algorithm.landed()
        return all_sum(flatten(z).double() * w)
    w = algorithm.push_sum.weight if name == "sgp" else 1.0
    return all_sum(flatten([p.detach() for p in params]).double() * w)


def mixing_case(ctx, name: str, options: dict, steps: int) -> dict:
    torch.manual_seed(100 + ctx.rank)  # different parameters on every rank
    model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    algorithm = make_algorithm(name, ctx, **options)
    algorithm.setup(model, optimizer)
    algorithm.start(range(steps))
    params = list(model.parameters())
    x0 = flatten([p.detach() for p in params])
    x0_rows = gather_rows(x0, ctx.world_size)
    mass0 = all_sum(x0.double())
    distances = [algorithm.metrics(model)["consensus_distance"]]
    raw = [consensus_distance(algorithm.comm, x0)]  # of the parameters as they are, nothing landed
    mass_err = 0.0
    for _ in range(steps):
        for p in params:
            p.grad = torch.zeros_like(p)  # only gossip moves the parameters
        algorithm.after_backward(model)
        algorithm.step(optimizer)
        algorithm.after_step(model)
        raw.append(consensus_distance(algorithm.comm, flatten([p.detach() for p in params])))
        distances.append(algorithm.metrics(model)["consensus_distance"])
        m = mass(algorithm, name, params)
        if m is not None:
            mass_err = max(mass_err, float((m - mass0).abs().max() / mass0.abs().max()))
    algorithm.close()
    z = flatten([p.detach() for p in params]).double()
    w = algorithm.push_sum.weight if name in ("sgp", "osgp") else 1.0
    final_mass = all_sum(z * w)
    mass_err = max(mass_err, float((final_mass - mass0).abs().max() / mass0.abs().max()))
    out = {"mass_rel_err": mass_err, "weight_sum": float(all_sum(torch.tensor([w]).double())),
           "distances": distances, "raw_distances": raw,
           "mean_err": worst(float((z - mass0 / ctx.world_size).abs().max()))}
    if name != "osgp":  # delays make osgp's trajectory differ from the plain product
        topology = algorithm.options.graph(ctx.world_size)
        expected = x0_rows
        for t in range(steps):
            expected = mixing_matrix(topology, t) @ expected
        out["reference_err"] = worst(float(np.abs(z.numpy() - expected[ctx.rank]).max()))
    return out


MIXING = [
    ("sgp exponential", "sgp", {"topology": "exponential"}, 6),
    ("sgp exponential 2 peers", "sgp", {"topology": "exponential", "peers_per_step": 2}, 4),
    ("sgp ring", "sgp", {"topology": "ring"}, 6),
    ("sgp complete", "sgp", {"topology": "complete"}, 1),
    ("osgp exponential lag 1", "osgp", {"topology": "exponential", "max_lag": 1}, 12),
    ("osgp exponential lag 2", "osgp", {"topology": "exponential", "max_lag": 2}, 12),
    ("dpsgd ring", "dpsgd", {"topology": "ring"}, 6),
    ("dpsgd complete", "dpsgd", {"topology": "complete"}, 1),
    ("adpsgd bipartite", "adpsgd", {"max_lag": 2}, 8),
]

def main() -> int:
    ctx = runtime.init(backend="gloo", device="cpu", timeout_s=120)
    assert ctx.world_size == 4, ctx
    torch.set_num_threads(1)
    for case, name, options, steps in MIXING:
        out = mixing_case(ctx, name, options, steps)
        if ctx.rank == 0:
            print(json.dumps({"case": case, **out}), flush=True)
    runtime.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
