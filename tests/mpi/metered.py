"""Under mpiexec -n N: the metered Communicator on a gloo world and on an mpi group over the same ranks.

For each: what every collective leaves in the buffers (against values computed by hand), and what
the meter holds after it (against traffic.collective_bytes, and no time or bytes for
account=None). Prints one JSON line per rank: {"failures": [...], "cases": k}.
"""

import json

import torch

from downpour_lib import comm, runtime
from downpour_lib.records import Meter
from downpour_lib.traffic import collective_bytes

ctx = runtime.init(backend="gloo", device="cpu", timeout_s=120)
n, r = ctx.world_size, ctx.rank
failures: list[str] = []
cases = 0


def check(name: str, ok: bool, detail: object = "") -> None:
    global cases
    cases += 1
    if not ok:
        failures.append(f"{name}: {detail}")


def metered(group: comm.Communicator) -> comm.Communicator:
    return comm.Communicator(group.ranks, group.group, r, Meter())


def expect_bytes(name: str, c: comm.Communicator, op: str, nbytes: int, root: int = 0) -> None:
    want = collective_bytes(op, nbytes, n, r, root)
    got = (c.meter.bytes_sent, c.meter.bytes_received)
    check(f"{name} bytes", got == want, f"{got} != {want}")
    c.meter.reset()


world = comm.world()
groups = {"gloo": world, "mpi": comm.new_group(world.ranks, backend="mpi")}
for backend, group in groups.items():
    c = metered(group)
    x = torch.full((6,), float(r + 1))
    c.allreduce(x)
    check(f"{backend} allreduce", torch.equal(x, torch.full((6,), n * (n + 1) / 2)), x)
    check(f"{backend} allreduce timed", c.meter.comm_s > 0 and c.meter.wait_s == 0, c.meter)
    expect_bytes(f"{backend} allreduce", c, "allreduce", 24)

    c.allreduce(x, account=None)
    check(f"{backend} account=None", c.meter == Meter(), c.meter)

    y = torch.full((4,), float(r))
    c.allreduce(y, op="mean", account="wait")
    check(f"{backend} mean", torch.allclose(y, torch.full((4,), (n - 1) / 2)), y)
    check(f"{backend} wait account", c.meter.wait_s > 0 and c.meter.comm_s == 0, c.meter)
    expect_bytes(f"{backend} mean", c, "allreduce", 16)

    handle = c.allreduce([torch.ones(3), torch.ones(2, 2)], async_op=True)
    expect_bytes(f"{backend} async counted at start", c, "allreduce", 28)
    a, b = handle.wait()
    check(f"{backend} async list", torch.equal(a, torch.full((3,), float(n)))
          and torch.equal(b, torch.full((2, 2), float(n))), (a, b))
    check(f"{backend} async untimed", c.meter.comm_s == 0, c.meter)

    root = n - 1
    t = torch.full((5,), float(r + 1))
    c.reduce(t, root=root, scratch=True)
    if r == root:
        check(f"{backend} reduce root", torch.equal(t, torch.full((5,), n * (n + 1) / 2)), t)
    expect_bytes(f"{backend} reduce", c, "reduce", 20, root)
    kept = torch.full((5,), float(r + 1))
    c.reduce(kept, root=root)
    if r != root:
        check(f"{backend} reduce keeps x", torch.equal(kept, torch.full((5,), float(r + 1))), kept)
    c.meter.reset()

    t = torch.full((3,), float(r))
    c.broadcast(t, root=1 % n)
    check(f"{backend} broadcast", torch.equal(t, torch.full((3,), float(1 % n))), t)
    expect_bytes(f"{backend} broadcast", c, "broadcast", 12, 1 % n)

    mine = torch.tensor([r, 10.0 * r])
    parts = c.allgather(mine)
    want = torch.tensor([[i, 10.0 * i] for i in range(n)])
    check(f"{backend} allgather", torch.equal(torch.stack(parts), want), parts)
    expect_bytes(f"{backend} allgather", c, "allgather", 8 * n)
    out = torch.empty(n, 2)
    got = c.allgather(mine, out=out)
    check(f"{backend} allgather out", got is out and torch.equal(out, want), out)
    expect_bytes(f"{backend} allgather out", c, "allgather", 8 * n)

    shard = torch.empty(2)
    got = c.reduce_scatter(torch.arange(2.0 * n) + r, out=shard)
    want = (torch.arange(2.0 * n) * n + n * (n - 1) / 2)[2 * r:2 * r + 2]
    check(f"{backend} reduce_scatter out", got is shard and torch.equal(shard, want), shard)
    expect_bytes(f"{backend} reduce_scatter", c, "reduce_scatter", 8 * n)

    # chunk j of rank i's input is 100 i + j; chunk i of rank j's output is what rank i sent it
    send = torch.tensor([100.0 * r + j for j in range(n) for _ in range(2)])
    recv = torch.empty_like(send)
    got = c.alltoall(send, out=recv)
    want = torch.tensor([100.0 * i + r for i in range(n) for _ in range(2)])
    check(f"{backend} alltoall out", got is recv and torch.equal(recv, want), recv)
    expect_bytes(f"{backend} alltoall", c, "alltoall", 8 * n)

print(json.dumps({"rank": r, "failures": failures, "cases": cases}), flush=True)
runtime.shutdown()
