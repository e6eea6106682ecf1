"""Start and stop torch.distributed for whatever launched us: mpiexec, srun, torchrun, or nothing.

``init()`` discovers the placement (``downpour_lib.launch_env``), agrees on a rendezvous without the user
setting MASTER_ADDR (rank 0 opens a TCPStore on a free port and broadcasts it over MPI; under srun
without MPI the first node of the step and a port derived from the job id; torchrun brings its own;
the ``mpi`` backend needs none: MPI itself knows the ranks), picks the device and backend, and
creates the default process group with an explicit timeout (and the start-up before it with a
deadline of its own: ``startup_timeout_s``). Backend ``auto`` is ``nccl`` on CUDA,
else ``mpi`` when this is an MPI launch that mpi4py can see (``comm/mpi`` provides it on
the stock torch wheel), else ``gloo``.
Degrades to one process: at world size 1 no process group is created and every collective in
``comm`` is a no-op, so algorithms and the engine run in plain unit tests.

``init(comm=...)`` takes the world from an mpi4py communicator instead of the launcher's variables:
long-lived MPI processes (ipyparallel engines) run jobs on a subset of themselves by splitting
COMM_WORLD, and must call ``shutdown()`` after each job so that the next one can ``init`` again.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.distributed as dist

from .. import _startup
from ..defaults import STARTUP_TIMEOUT_S, TIMEOUT_S
from ..errors import ConfigError
from ..launch_env import Placement, discover, slurm_rendezvous
from . import addresses, job_end, mpi, peers

Backend = Literal["auto", "gloo", "nccl", "mpi"]
BACKENDS = ("auto", "gloo", "nccl", "mpi")
DeviceChoice = Literal["auto", "cpu", "cuda"]


@dataclass(frozen=True)
class DistContext:
    """Everything a rank needs to know about the job it is part of."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    backend: str | None  # None when there is no process group (world size 1)
    launcher: str
    hosts: tuple[str, ...] = field(default=())  # host name of every rank, by rank
    timeout_s: float = TIMEOUT_S  # the default group's timeout; runtime.new_group gives later groups the same

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @classmethod
    def single(cls, device: str | torch.device = "cpu") -> DistContext:
        """A world of one, with no process group: what unit tests and `local` training use."""
        return cls(0, 1, 0, 1, torch.device(device), None, "single", (socket.gethostname(),))


def launch_mpi_world():
    """mpi4py's COMM_WORLD when this launch is an MPI one, else None (a launch that may run without
    MPI: compare ``cluster.remote.engine_mpi_world``, for processes that are always MPI ranks).

    Importing ``mpi4py.MPI`` initializes MPI, so it is only done when a launcher says we run under
    MPI, or when the user already did it.
    """
    if "mpi4py.MPI" not in sys.modules and discover(os.environ).launcher != "mpi":
        return None
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    return MPI.COMM_WORLD if MPI.Is_initialized() and not MPI.Is_finalized() else None


def pick_device(choice: DeviceChoice, local_rank: int) -> torch.device:
    if choice == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        # More ranks than GPUs on a node share them round-robin rather than failing.
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    if choice == "cuda":
        raise ConfigError("device", choice, f"CUDA is not available on {socket.gethostname()}; "
                                            "use device 'cpu' or 'auto'")
    return torch.device("cpu")


def gpus_shared(device: torch.device, local_world_size: int) -> int:
    """How many GPUs this node's ``local_world_size`` ranks on ``device`` share (round-robin,
    ``pick_device``), where there are fewer GPUs than ranks; 0 where each rank has its own, or
    ``device`` is not CUDA."""
    count = torch.cuda.device_count() if device.type == "cuda" else 0
    return count if 0 < count < local_world_size else 0


def check_device(backend: Backend, device: DeviceChoice, local_rank: int,
                 local_world_size: int = 1) -> None:
    """Refuse a device or a backend that this machine cannot give (device 'cuda' or backend
    'nccl' without CUDA, nccl with ranks sharing a GPU, mpi where torch keeps the name) before
    init, where it would fail on every rank with a traceback. At any world size: a launch that
    cannot run on N ranks should not seem to work on one."""
    dev = pick_device(device, local_rank)
    if backend == "nccl" and dev.type != "cuda":
        why = (f"device {device!r} is not CUDA" if torch.cuda.is_available()
               else f"CUDA is not available on {socket.gethostname()}")
        raise ConfigError("backend", backend,
                          f"nccl needs CUDA devices and {why}; use backend 'gloo' or 'auto'")
    check_backend(backend, gpus_shared(dev, local_world_size), local_world_size)


def mpi_name_taken() -> str:
    """Why ``mpi`` cannot be ours on this torch (``mpi.usable()`` false): each refusal adds what to
    use instead."""
    return (f"downpour's mpi backend needs torch 2.14 or later, and this is torch {torch.__version__}, "
            "whose c10d keeps the name 'mpi' for its own MPI build (which PyPI's wheels lack)")


def check_backend(choice: Backend, sharing: int = 0, local_world_size: int = 1) -> None:
    """Refuse nccl where this node's ``local_world_size`` ranks share ``sharing`` GPUs (NCCL's
    "Duplicate GPU detected"), and mpi where this torch keeps the name for its own MPI build."""
    if choice == "nccl" and sharing:
        raise ConfigError("backend", choice,
                          f"{local_world_size} ranks on {socket.gethostname()} share its {sharing} "
                          "GPU(s), and NCCL takes one rank per GPU; use backend 'gloo' or 'mpi' "
                          f"(or 'auto'), or launch at most {sharing} rank(s) per node")
    if choice == "mpi" and not mpi.usable():
        raise ConfigError("backend", choice, f"{mpi_name_taken()}; use backend 'gloo', or torch 2.14")


def pick_backend(choice: Backend, device: torch.device, mpi_world: bool = False, sharing: int = 0,
                 local_world_size: int = 1) -> str:
    """The backend to use; ``mpi_world``: MPI is initialized here and spans the whole launch;
    ``sharing``: the GPUs this node's ``local_world_size`` ranks share (``gpus_shared``), which
    NCCL refuses ("Duplicate GPU detected"), so ``auto`` takes mpi or gloo there instead."""
    if choice not in BACKENDS:
        raise ConfigError("backend", choice, "choose one of " + ", ".join(BACKENDS))
    if choice == "nccl" and device.type != "cuda":
        raise ConfigError("backend", choice, "nccl needs CUDA devices; use 'gloo' or 'auto' on CPU")
    check_backend(choice, sharing, local_world_size)
    if choice == "mpi" and not mpi_world:
        raise ConfigError("backend", choice, "mpi needs an MPI launch that mpi4py can see (mpiexec, "
                          "or srun --mpi=pmix) and `pip install downpour[mpi]`; use 'gloo' or 'auto'")
    if choice == "auto":
        if device.type == "cuda" and not sharing:
            return "nccl"
        return "mpi" if mpi_world and mpi.usable() else "gloo"
    return choice


def backend_usable(name: str) -> bool:
    """Whether this build and machine can run backend ``name``: gloo if torch has it, nccl with
    CUDA GPUs, mpi where this torch lets ours take the name (or has its own)."""
    if name == "gloo":
        return dist.is_gloo_available()
    if name == "nccl":
        return dist.is_nccl_available() and torch.cuda.is_available()
    if name == "mpi":
        return mpi.usable()
    return True


def _rendezvous_store(placement: Placement, comm, timeout: datetime.timedelta) -> dist.Store:
    """Rank 0 opens a TCPStore on a free port (no race for it) and MPI tells everyone where it is:
    on one host its loopback address; across hosts every address it has (``addresses``), of which
    each rank takes the first it reaches. ``MASTER_ADDR`` and ``MASTER_PORT`` win when set."""
    hosts = comm.allgather(socket.gethostname())
    store, where = None, None
    if placement.rank == 0:
        if os.environ.get("MASTER_ADDR"):
            offer = [os.environ["MASTER_ADDR"]]
        elif len(set(hosts)) == 1:
            offer = ["127.0.0.1"]
        else:
            offer = addresses.host_addresses(os.environ.get(addresses.IFNAME_VARIABLE))
        try:  # the server listens on every interface; the address is the clients' to choose
            if not offer:
                raise ConfigError(addresses.IFNAME_VARIABLE,
                                  os.environ.get(addresses.IFNAME_VARIABLE),
                                  "no interface of this host that is up matches it (its "
                                  f"interfaces: {', '.join(addresses.interface_names())})")
            store = dist.TCPStore(offer[0],
                                  int(os.environ.get("MASTER_PORT", 0)), placement.world_size,
                                  True, timeout=timeout, wait_for_workers=False)
            where = (offer, store.port)
        except Exception as exc:  # noqa: BLE001 -- every rank must learn of it, not wait
            where = (f"rank 0 on {hosts[0]} could not open the rendezvous store: "
                     f"{type(exc).__name__}: {exc}", 0)
    offer, port = comm.bcast(where, root=0)
    if isinstance(offer, str):
        raise RuntimeError(offer)
    if store is None:
        addr = offer[0] if len(offer) == 1 else addresses.reachable(offer, port)
        if addr is None:
            raise RuntimeError(
                f"rank {placement.rank} on {hosts[placement.rank]} cannot reach the rendezvous "
                f"store of rank 0 on {hosts[0]} at any of its addresses {offer} (port {port}); "
                f"name the interface the nodes share with {addresses.IFNAME_VARIABLE}=<name> "
                "(e.g. ib0 or eth0), or set MASTER_ADDR to an address of that host")
        store = _connect(addr, port, placement, timeout, f"rank 0 on {hosts[0]}",
                         hosts[placement.rank])
    return store


def _launcher_store(placement: Placement, addr: str, port: int,
                    timeout: datetime.timedelta) -> dist.Store:
    """The store at ``addr:port`` that the launcher named, as torch's ``env://`` and ``tcp://``
    make it (rank 0 hosts it, unless torchrun's agent does: ``TORCHELASTIC_USE_AGENT_STORE``),
    with a deadline on the clients' connect (``_connect``), which torch's has not."""
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    if placement.rank == 0 and not agent:
        return dist.TCPStore(addr, port, placement.world_size, True, timeout=timeout,
                             multi_tenant=True)
    server = f"torchrun's agent on {addr}" if agent else f"rank 0 on {addr}"
    return _connect(addr, port, placement, timeout, server, socket.gethostname())


def _connect(addr: str, port: int, placement: Placement, timeout: datetime.timedelta,
             server: str, host: str) -> dist.Store:
    """A client of the store at ``addr:port``, or, once ``timeout`` has passed, an error naming
    its ``server``. torch's connect waits for the server's first answer without a deadline, and
    the kernel accepts the connection for a server process that is stopped (SIGSTOP) or hung, so
    the ranks waited there for ever; the connect runs on a thread of its own (it releases the GIL)
    while this one sleeps until the timeout, and is left there if it never ends (the job is
    ending)."""
    made: list = []

    def connect() -> None:
        try:
            made.append(dist.TCPStore(addr, port, placement.world_size, False, timeout=timeout))
        except Exception as exc:  # noqa: BLE001 -- raised on the calling thread below
            made.append(exc)

    thread = threading.Thread(target=connect, name="downpour-store-connect", daemon=True)
    thread.start()
    thread.join(timeout.total_seconds())
    if not made:
        raise RuntimeError(
            f"rank {placement.rank} of {placement.world_size} on {host} waited "
            f"{timeout.total_seconds():.0f} s for the rendezvous store of {server} at "
            f"{addr}:{port}: it took the connection but never answered (stopped, hung or "
            "overloaded)")
    if isinstance(made[0], Exception):
        raise made[0]
    return made[0]


def placement_of(comm) -> Placement:
    """This process's place in the world that the mpi4py communicator ``comm`` defines."""
    from mpi4py import MPI

    node = comm.Split_type(MPI.COMM_TYPE_SHARED)  # the ranks of ``comm`` that share this node
    try:
        return Placement(comm.Get_rank(), comm.Get_size(), node.Get_rank(), node.Get_size(), "mpi")
    finally:
        node.Free()


_CONTEXT: DistContext | None = None


def init(backend: Backend = "auto", device: DeviceChoice = "auto",
         timeout_s: float = TIMEOUT_S, comm=None,
         startup_timeout_s: float = STARTUP_TIMEOUT_S) -> DistContext:
    """Create the default process group for this launch (idempotent) and return the context.

    ``timeout_s``: how long the group's operations wait for a silent peer. ``startup_timeout_s``:
    how long a rank waits for the others to start before that (MPI's initialization, the
    rendezvous store, the group's creation), which on many nodes can take minutes.

    ``comm``: an mpi4py communicator that defines the world (rank, size, local rank and the
    rendezvous all come from it), e.g. ``MPI.COMM_WORLD.Split(...)`` to train on some of the
    processes of a running MPI job. By default the launcher's variables define it.
    """
    global _CONTEXT
    if _CONTEXT is not None:
        if comm is not None and (comm.Get_rank(), comm.Get_size()) != (_CONTEXT.rank,
                                                                      _CONTEXT.world_size):
            raise RuntimeError("runtime.init(comm=...) for a different world than the one already "
                               "initialized: call runtime.shutdown() after each job")
        return _CONTEXT
    placement = discover(os.environ) if comm is None else placement_of(comm)
    dev = pick_device(device, placement.local_rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if placement.world_size == 1:
        _startup.done()
        _CONTEXT = DistContext(0, 1, 0, 1, dev, None, placement.launcher, (socket.gethostname(),))
        return _CONTEXT
    timeout = datetime.timedelta(seconds=timeout_s)
    startup = datetime.timedelta(seconds=startup_timeout_s)
    # the start-up's waits have a deadline too (``_startup``: a no-op outside `downpour train`)
    if comm is None and placement.launcher == "mpi":
        _startup.waiting("MPI init", startup_timeout_s, placement.rank, placement.world_size)
        comm = launch_mpi_world()
    _startup.waiting("the rendezvous", startup_timeout_s, placement.rank, placement.world_size)
    mpi_world = comm is not None and comm.Get_size() == placement.world_size
    name = pick_backend(backend, dev, mpi_world, gpus_shared(dev, placement.local_world_size),
                        placement.local_world_size)
    kwargs: dict = {"backend": name, "rank": placement.rank, "world_size": placement.world_size,
                    "timeout": timeout}
    if dev.type == "cuda":
        kwargs["device_id"] = dev
    if mpi_world:
        mpi.use_world(comm)  # mpi groups (default or not) are made within this communicator
    if name == "mpi":
        # MPI assigns ranks itself and needs no store (torch ignores rank/world_size for it).
        mpi.register()
        kwargs = {"backend": name, "timeout": timeout}
    elif mpi_world:
        kwargs["store"] = _rendezvous_store(placement, comm, startup)
    elif placement.launcher in ("mpi", "slurm"):
        # srun without a usable MPI: the first node of the step hosts the store.
        kwargs["store"] = _launcher_store(placement, *slurm_rendezvous(os.environ), startup)
    elif os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT", "").isdigit():
        # torchrun (its agent hosts the store) and RANK/WORLD_SIZE/MASTER_ADDR launches
        kwargs["store"] = _launcher_store(placement, os.environ["MASTER_ADDR"],
                                          int(os.environ["MASTER_PORT"]), startup)
    else:
        kwargs["init_method"] = "env://"  # torch says which variable is missing
    dist.init_process_group(**kwargs)
    if dist.get_rank() != placement.rank:
        raise RuntimeError(f"backend {name} made this process rank {dist.get_rank()}, but the "
                           f"launcher says {placement.rank}")
    # every rank's host, and its addresses: a peer that gloo names by address is named by rank
    where: list = [None] * placement.world_size
    dist.all_gather_object(where, (socket.gethostname(), addresses.host_addresses()))
    hosts = [host for host, _ in where]
    _startup.done()  # from here the backend's own deadlines hold
    if "store" in kwargs:  # and the store's: a later group's rendezvous waits as its operations do
        kwargs["store"].set_timeout(timeout)
    if name != "mpi":  # the mpi backend has a watchdog of its own (comm/mpi/liveness)
        peers.start(placement.rank, placement.world_size, hosts, [a for _, a in where], name)
    _CONTEXT = DistContext(placement.rank, placement.world_size, placement.local_rank,
                           placement.local_world_size, dev, name, placement.launcher, tuple(hosts),
                           timeout_s)
    return _CONTEXT


def shutdown() -> None:
    """Destroy the process group created by ``init`` (safe to call twice)."""
    global _CONTEXT
    peers.stop()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    mpi.use_world(None)
    _CONTEXT = None


def new_group(ranks=None, backend: str | None = None) -> dist.ProcessGroup:
    """``dist.new_group`` with the job's timeout (``init``'s ``timeout_s``). torch gives a group
    made without one its own default of 30 minutes, whatever the default group's timeout, so a rank
    waiting on a silent peer in it would outlast ``--timeout-s`` by half an hour. Collective over
    the world, like ``dist.new_group``."""
    timeout_s = _CONTEXT.timeout_s if _CONTEXT is not None else DistContext.timeout_s
    return dist.new_group(ranks=ranks, backend=backend,
                          timeout=datetime.timedelta(seconds=timeout_s))


@contextmanager
def session(backend: Backend = "auto", device: DeviceChoice = "auto",
            timeout_s: float = TIMEOUT_S, comm=None,
            startup_timeout_s: float = STARTUP_TIMEOUT_S) -> Iterator[DistContext]:
    """``with runtime.session() as ctx:`` — init on entry, shutdown on exit."""
    ctx = init(backend, device, timeout_s, comm, startup_timeout_s)
    try:
        yield ctx
    finally:
        shutdown()


def abort(exc: BaseException, code: int = 1) -> None:
    """Report which rank failed and take the whole job down, so no other rank waits forever.

    One line on stderr, the traceback in a log it names (``job_end``). Under MPI the job ends
    (``job_end.end_job``: mpiexec then kills every rank); otherwise the process exits at once
    without running atexit handlers that could block on a dead peer, and the launcher (torchrun,
    srun --kill-on-bad-exit) or the other ranks' process-group timeout ends the rest.
    """
    placement = discover(os.environ)
    # gloo, nccl: a peer's failure names the rank that went silent, and where (mpi names it itself)
    named = peers.explain(exc)
    job_end.report(placement.rank, placement.world_size, named or f"{type(exc).__name__}: {exc}", exc)
    comm = launch_mpi_world()
    job_end.end_job(code, comm if comm is not None and comm.Get_size() > 1 else None)


@contextmanager
def abort_on_error() -> Iterator[None]:
    """Any exception in the block (on any rank) ends the whole job, naming the failed rank."""
    try:
        yield
    except BaseException as exc:  # noqa: BLE001 -- Ctrl-C and SystemExit must not leave peers waiting
        abort(exc, 130 if isinstance(exc, KeyboardInterrupt) else 1)
