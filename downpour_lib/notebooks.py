"""Execute a notebook headless, with its ``parameters`` cell overridden (papermill's convention).

The notebook's cell tagged ``parameters`` holds its defaults. ``run_notebook`` inserts a cell tagged
``injected-parameters`` right after it that assigns the overrides, then runs every cell in a fresh
kernel (nbclient) with the notebook's directory as the working directory, the way Jupyter would.
An override whose name is not assigned in the ``parameters`` cell is an error, not silently ignored.
The notebook on disk is never modified: an executed copy is written only where ``output`` says.
"""

from __future__ import annotations

import ast
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .checkpoint import atomic_write_text
from .errors import ConfigError, DownpourError

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # IPython colours its tracebacks


class NotebookError(DownpourError):
    """A cell raised; the message holds the notebook, the cell and the traceback. ``bad_input``:
    where the cell refused a setting (``ConfigError``, ``DataError``), its one line (naming the
    notebook), which is all a caller needs to say; else ''."""

    def __init__(self, message: str, bad_input: str = "") -> None:
        super().__init__(message)
        self.bad_input = bad_input


#: the exceptions a cell raises for bad input, and a cluster it cannot use or start
#: (``ClusterError``: the profile's running clusters, engines that did not start), which
#: ``one_line_errors`` shows as their message alone: a traceback through the library adds nothing
BAD_INPUT = ("ConfigError", "DataError", "ClusterError")
#: Seconds one cell of a headless notebook may run (``run_notebook``, ``downpour notebook run``).
CELL_TIMEOUT_S = 1800.0
#: Seconds a cell's output may trail its reply. Past nbclient's default, 4 s, which a loaded machine
#: can take, the outputs still on their way are missing from the executed notebook. The wait ends
#: as soon as the kernel says it is idle, so a quiet machine waits no longer.
IOPUB_TIMEOUT_S = 120
#: Seconds a cell past its timeout has, once interrupted, to reply before its kernel is shut down
INTERRUPTED_REPLY_S = 30


def _one_line(shell, etype, value, tb, tb_offset=None) -> list[str]:
    stb = [f"{etype.__name__}: {value}"]
    shell._showtraceback(etype, value, stb)  # a custom handler shows its own traceback
    return stb


def one_line_errors(shell) -> None:
    """In an IPython ``shell``: bad input (``ConfigError``, ``DataError``) shows as the one line the
    command line gives (``algorithms='nope' is not valid: choose from ...``), not as a traceback
    through the library: the cell still fails, and the line names the parameter and what works.
    So does a ``ClusterError`` (which cluster runs, what to change)."""
    from .errors import ClusterError, DataError

    shell.set_custom_exc((ConfigError, DataError, ClusterError), _one_line)


def show_errors_in_one_line() -> None:
    """In IPython (a notebook, a console), ``one_line_errors`` on its shell; elsewhere nothing (a
    rank or a script pays nothing). Called by a notebook's first cell and by the helpers notebooks
    call first (``start_cluster``, ``run_study``), not on import: importing the library runs
    nothing. Calling it again changes nothing."""
    ipython = sys.modules.get("IPython")  # never imported here
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is not None:
        one_line_errors(shell)


def parameters_cell(nb) -> int:
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and "parameters" in cell.get("metadata", {}).get("tags", []):
            return index
    raise ConfigError("notebook", nb.metadata.get("title", "?"),
                      "it needs a code cell tagged `parameters` holding its defaults")


def parameter_names(source: str) -> list[str]:
    names = []
    for node in ast.parse(source).body:
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) else [])
        names += [t.id for t in targets if isinstance(t, ast.Name)]
    return names


def inject_parameters(nb, parameters: Mapping[str, Any]):
    """A copy of ``nb`` with a cell assigning ``parameters`` after its ``parameters`` cell."""
    import copy

    import nbformat

    nb = copy.deepcopy(nb)
    index = parameters_cell(nb)
    known = parameter_names(nb.cells[index].source)
    for name in parameters:
        if name not in known:
            raise ConfigError("parameter", name, "the notebook's parameters are " + ", ".join(known))
    if parameters:
        lines = ["# Parameters injected by downpour_lib.notebooks.run_notebook"]
        lines += [f"{name} = {value!r}" for name, value in parameters.items()]
        cell = nbformat.v4.new_code_cell("\n".join(lines))
        cell.metadata["tags"] = ["injected-parameters"]
        nb.cells.insert(index + 1, cell)
    return nb


def _client_class(echo: bool):
    import asyncio
    import contextlib
    import signal
    from queue import Empty

    from jupyter_core.utils import ensure_async, run_sync
    from nbclient import NotebookClient

    class Client(NotebookClient):
        """Echoes the cells' printed output as it arrives (a long study shows its progress)."""

        def output(self, outs, msg, display_id, cell_index):
            if echo and msg["msg_type"] == "stream":
                stream = sys.stderr if msg["content"]["name"] == "stderr" else sys.stdout
                stream.write(msg["content"]["text"])
                stream.flush()
            return super().output(outs, msg, display_id, cell_index)

        # Ctrl-C interrupts the running cell, as JupyterLab's stop button does (the kernel runs in
        # a session of its own, which a terminal's Ctrl-C does not reach): the cell ends in
        # KeyboardInterrupt and the kernel shuts down as after a failed cell, stopping a cluster
        # the notebook started. nbclient's own handler, which each cell's replaces, killed the
        # kernel mid-cell and left that cluster running. A second Ctrl-C stops at once.
        async def async_execute(self, *args, **kwargs):
            self.main_task, self.pressed = asyncio.current_task(), 0
            return await super().async_execute(*args, **kwargs)

        execute = run_sync(async_execute)  # nbclient's execute runs its own async_execute

        async def async_execute_cell(self, *args, **kwargs):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # main thread only
                asyncio.get_running_loop().add_signal_handler(signal.SIGINT, self.interrupt)
            return await super().async_execute_cell(*args, **kwargs)

        def interrupt(self):
            self.pressed += 1
            if self.pressed == 1 and self.km is not None:
                self.interrupting = asyncio.ensure_future(ensure_async(self.km.interrupt_kernel()))
            else:
                self.main_task.cancel()

        async def _async_handle_timeout(self, timeout, cell=None):
            # Interrupt the cell and take its reply before giving up on it: the kernel then shuts
            # down as after a finished run (a cluster the notebook started stops with it), not in
            # the middle of a cell, which printed the kernel's own traceback above our line.
            if self.km is not None and self.kc is not None:
                await ensure_async(self.km.interrupt_kernel())
                with contextlib.suppress(Empty):  # a cell that ignores the interrupt: shut down
                    await ensure_async(self.kc.shell_channel.get_msg(timeout=INTERRUPTED_REPLY_S))
            return await super()._async_handle_timeout(timeout, cell)

    return Client


def run_notebook(path: str | os.PathLike, parameters: Mapping[str, Any] | None = None, *,
                 output: str | os.PathLike | None = None, timeout_s: float = CELL_TIMEOUT_S,
                 echo: bool = False, env: Mapping[str, str] | None = None):
    """Execute the notebook at ``path`` with ``parameters``; returns the executed notebook."""
    import asyncio

    import nbformat
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    shown, path = str(path), Path(path).resolve()
    if not path.is_file():
        raise ConfigError("notebook", shown, "no such file" + (" (a directory)" if path.is_dir()
                          else "") + ": give a notebook, e.g. notebooks/02_scaling_study.ipynb")
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as exc:  # noqa: BLE001 -- nbformat raises many kinds for a file it cannot read
        raise ConfigError("notebook", shown, f"not a Jupyter notebook ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    if parameters:  # a notebook without a `parameters` cell runs as it is when given none
        try:
            nb = inject_parameters(nb, parameters)
        except ConfigError as exc:
            if exc.field != "notebook":
                raise
            raise ConfigError("notebook", shown, exc.expected + " (-p sets those)") from None
    # The kernel is this Python's ipykernel; its kernelspec says just "python", so put this
    # environment's bin first on PATH (mpiexec and ipengine come from there too).
    kernel_env = dict(os.environ if env is None else env)
    kernel_env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), kernel_env.get("PATH", "")])
    # ipykernel's debugger warns, on the kernel's stderr, that frozen modules may hide breakpoints:
    # noise in a headless run's output, above any error it has to show
    kernel_env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    # the kernel's own WARNINGs (e.g. "running over TCP without encryption", on this machine's
    # loopback) would stand above a run's output and its errors: only its errors show
    client = _client_class(echo)(nb, timeout=int(timeout_s), iopub_timeout=IOPUB_TIMEOUT_S,
                                 kernel_name="python3",
                                 extra_arguments=["--IPKernelApp.log_level=ERROR"],
                                 resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute(env=kernel_env)
    except asyncio.CancelledError:  # Ctrl-C twice
        raise KeyboardInterrupt(f"{path.name}: stopped in cell {_running_cell(nb)}") from None
    except CellExecutionError as exc:
        if exc.ename == "KeyboardInterrupt":
            raise KeyboardInterrupt(f"{path.name}: interrupted in cell {_running_cell(nb)}") from None
        bad = f"{path.name}: {ANSI.sub('', exc.evalue)}" if exc.ename in BAD_INPUT else ""
        raise NotebookError(f"{path.name} failed:\n" + ANSI.sub("", str(exc)), bad) from None
    except CellTimeoutError:  # its message previews the cell's source: the count says which
        raise NotebookError(f"{path.name}: cell {_running_cell(nb)} ran past the limit of "
                            f"{timeout_s:g} s a cell and was stopped: give a longer --timeout "
                            "(timeout_s=), or fewer steps") from None
    except DeadKernelError:
        raise NotebookError(f"{path.name}: the kernel died in cell {_running_cell(nb)} (killed, or "
                            "out of memory): its output above shows how far it got") from None
    finally:
        if output is not None:
            atomic_write_text(output, nbformat.writes(nb))
    return nb


def _running_cell(nb) -> str:
    """The cell that was running when a run stopped, as the saved notebook numbers it: ``[N]``, the
    last execution count given (nbclient gives one as a cell starts)."""
    counts = [c.execution_count for c in nb.cells if c.cell_type == "code" and c.get("execution_count")]
    return f"[{counts[-1]}]" if counts else "[1]"


# -- JupyterLab on this environment's kernel (`make lab`, `downpour lab`) ----------------------------

KERNEL = "python3"  # the name every notebook's metadata asks for: they open without a kernel picker


def install_kernel(prefix: str | os.PathLike = sys.prefix) -> Path:
    """Write ``PREFIX/share/jupyter/kernels/python3`` for this Python (``ipykernel install
    --sys-prefix`` with an absolute interpreter), with this environment's bin first on the kernel's
    PATH: the kernel imports this downpour_lib, and its clusters find this environment's mpiexec
    and ipengine. Returns the kernel's directory."""
    import json

    bin_dir = Path(sys.executable).parent
    path = Path(prefix) / "share" / "jupyter" / "kernels" / KERNEL
    path.mkdir(parents=True, exist_ok=True)
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": f"Python 3 ({Path(sys.prefix).name})", "language": "python",
            # jupyter_client substitutes ${PATH} from the server's environment
            "env": {"PATH": f"{bin_dir}{os.pathsep}${{PATH}}"},
            "metadata": {"debugger": True}}
    atomic_write_text(path / "kernel.json", json.dumps(spec, indent=1) + "\n")
    return path


def lab_command(directory: str | os.PathLike, args=(), prefix: str | os.PathLike = sys.prefix,
                env: Mapping[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """The command and environment that start JupyterLab on ``directory`` with this Python's kernel
    (installed first). ``JUPYTER_PATH`` puts that kernel ahead of a ``python3`` kernel in the user's
    own Jupyter directory (``~/.local/share/jupyter``), which would otherwise win."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ConfigError("directory", str(directory), "give a directory of notebooks, e.g. notebooks/")
    install_kernel(prefix)
    env = dict(os.environ if env is None else env)
    data = str(Path(prefix) / "share" / "jupyter")
    env["JUPYTER_PATH"] = os.pathsep.join(p for p in (data, env.get("JUPYTER_PATH", "")) if p)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    argv = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={directory.resolve()}", *args]
    if os.geteuid() == 0:  # Jupyter refuses root unless told; as with Open MPI, say so only as root
        argv.append("--allow-root")
    return argv, env
