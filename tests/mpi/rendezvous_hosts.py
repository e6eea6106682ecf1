"""Under mpiexec -n 2: the rendezvous when the ranks report different host names.

Rank 1 pretends to be on another node (``socket.gethostname`` answers "far-node"), so the
runtime takes the path of several hosts: rank 0 offers its interfaces' addresses, not 127.0.0.1
(which another node could not use), and rank 1 takes the first it reaches. Prints the address the
store was reached at and a gloo allreduce's result; argv[1] = "fail" sets an interface filter
that matches nothing, which must stop every rank with a message instead of a hang.
"""

import os
import socket
import sys

import torch
import torch.distributed as dist
from mpi4py import MPI

from downpour_lib.comm import runtime

if MPI.COMM_WORLD.Get_rank() == 1:
    socket.gethostname = lambda: "far-node"
if sys.argv[1:] == ["fail"]:
    os.environ["DOWNPOUR_SOCKET_IFNAME"] = "no-such-interface"

ctx = runtime.init(backend="gloo", timeout_s=60)
t = torch.full((4,), float(ctx.rank + 1))
dist.all_reduce(t)
store = dist.distributed_c10d._get_default_store()
while hasattr(store, "underlying_store"):  # the PrefixStore around the TCPStore
    store = store.underlying_store
print(f"rank {ctx.rank} reached the store at {store.host}, allreduce {t.tolist()}", flush=True)
runtime.shutdown()
