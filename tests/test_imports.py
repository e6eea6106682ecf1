"""The library's modules import each other without a circle, so each can be read (and imported)
from the bottom up, as DESIGN.md's library map says: dependencies point down only.

The graph is read from the source (every ``import``, module level or inside a function, since a
function-local import that reaches back up is a circle too, only a hidden one), one node per module.
Importing a submodule also runs its package's ``__init__``; that implicit edge is not counted (every
package would be in a circle with its own modules).
"""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from conftest import BIN, ROOT, explain, launch_env

from downpour_lib import preempt

PACKAGE = ROOT / "downpour_lib"


def modules() -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package) for every module of the library."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if package else parts)] = (path, package)
    return found


def imported(name: str, package: bool, node: ast.Import | ast.ImportFrom, known) -> list[str]:
    """The library modules ``node`` (in module ``name``) imports."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name.split(".")[0] == "downpour_lib"]
    if node.level:
        base = name.split(".") if package else name.split(".")[:-1]
        base = base[:len(base) - node.level + 1]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if target.split(".")[0] != "downpour_lib":
        return []
    # ``from .pkg import mod`` imports the module ``pkg.mod``; ``from .mod import name`` the module
    return [f"{target}.{a.name}" if f"{target}.{a.name}" in known else target for a in node.names]


def import_graph() -> dict[str, set[str]]:
    known = modules()
    graph = {}
    for name, (path, package) in known.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for target in imported(name, package, node, known):
                    while target not in known:  # an attribute of a module: the module
                        target = target.rsplit(".", 1)[0]
                    if target != name:
                        edges.add(target)
        graph[name] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each a circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_circle_finder_finds_a_circle_through_a_function_local_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
    # the graph reads function-local imports too (the kind the config/algorithms circle used)
    node = ast.parse("def f():\n    from ..config import build_options\n").body[0].body[0]
    known = {"downpour_lib.config": None, "downpour_lib.algorithms": None}
    assert imported("downpour_lib.algorithms", True, node, known) == ["downpour_lib.config"]


def test_the_library_has_no_import_circle():
    graph = import_graph()
    assert len(graph) > 50 and "downpour_lib.engine" in graph["downpour_lib.cli.train"] | {
        t for v in graph["downpour_lib.cli.train"] for t in graph[v]}, "the graph was not read"
    assert circles(graph) == [], "modules that import each other (directly or around a circle)"


def package_of(module: str, known: dict[str, tuple[Path, bool]]) -> str:
    """The node a module belongs to in the package-level graph: its top-level package for a module
    inside one (``downpour_lib.comm.mpi.shm`` -> ``comm``), the module itself for a top-level
    module (``notebooks``) or a top-level package's ``__init__`` (``cluster/__init__``: what it
    re-exports from its modules is an arrow into the package, as any importer's is)."""
    parts = module.split(".")
    if len(parts) > 2:
        return parts[1]
    return f"{parts[1]}/__init__" if len(parts) == 2 and known[module][1] else parts[-1]


def package_graph(graph: dict[str, set[str]]) -> tuple[dict[str, set[str]], dict]:
    """The graph of ``package_of``'s nodes, and for each arrow of it the module arrows behind it."""
    known = modules()
    nodes: dict[str, set[str]] = {}
    behind: dict[tuple[str, str], list[str]] = {}
    for a, targets in graph.items():
        pa = package_of(a, known)
        nodes.setdefault(pa, set())
        for b in sorted(targets):
            pb = package_of(b, known)
            if pa != pb:
                nodes[pa].add(pb)
                behind.setdefault((pa, pb), []).append(
                    f"{a.removeprefix('downpour_lib.')} -> {b.removeprefix('downpour_lib.')}")
    return nodes, behind


def test_the_library_has_no_package_circle():
    """Whole packages point down only, as DESIGN.md's library map draws them: no module of a
    package imports one of a package that (through any others) imports it back. A module-level
    graph can have no circle while its packages do (``cluster.cli -> study.core`` and
    ``study.core -> cluster`` made one, with no module circle, until the command line moved to
    ``cli/``)."""
    nodes, behind = package_graph(import_graph())
    assert {"study", "cluster", "comm", "bench", "cluster/__init__", "engine"} <= set(nodes), \
        "the package graph was not read"
    found = circles(nodes)
    arrows = [f"  {pa} -> {pb}: " + ", ".join(behind[pa, pb][:3])
              + (f" (and {len(behind[pa, pb]) - 3} more)" if len(behind[pa, pb]) > 3 else "")
              for members in found for pa in members for pb in sorted(nodes[pa] & set(members))]
    assert found == [], ("packages that import each other around a circle, "
                         + "; ".join(" ".join(c) for c in found) + "; the arrows that close it:\n"
                         + "\n".join(arrows))



# What ``import downpour_lib`` must leave as it was, printed as JSON: every signal's handler, the
# process's children, an IPython shell's custom exception handlers, and whether torch was imported.
IMPORT_ONLY = """
import json, os, signal, sys
import psutil
from IPython.core.interactiveshell import InteractiveShell

shell = InteractiveShell.instance()
signals = [s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)]
before = {s: signal.getsignal(s) for s in signals}
import downpour_lib
after = {s: signal.getsignal(s) for s in signals}
print(json.dumps({"changed": [signal.Signals(s).name for s in signals if before[s] != after[s]],
                  "children": [p.pid for p in psutil.Process().children()],
                  "hooked": bool(shell.custom_exceptions), "torch": "torch" in sys.modules,
                  "argv": sys.argv[1:]}))
"""


def test_importing_the_library_runs_nothing(tmp_path):
    """``import downpour_lib`` parses no sys.argv, installs no signal handler, forks no start-up
    sentinel, hooks no IPython and imports nothing heavy, even in a program named ``downpour``
    whose arguments are ``train`` (what the import-time hold looked for), as a rank of an MPI job
    (what the sentinel looked for), under an IPython shell (what the hook looked for)."""
    program = tmp_path / "downpour"
    program.write_text(IMPORT_ONLY)
    env = {**launch_env(), "OMPI_COMM_WORLD_RANK": "0", "PMIX_NAMESPACE": f"test-{uuid.uuid4().hex}"}
    proc = subprocess.run([sys.executable, str(program), "train", "--preempt-signal", "USR1"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, explain(proc)
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen == {"changed": [], "children": [], "hooked": False, "torch": False,
                    "argv": ["train", "--preempt-signal", "USR1"]}, explain(proc)


#: runs one command line in-process, then prints which heavy modules it loaded
LOADED = """
import json, sys
from downpour_lib.cli import main
try:
    main(sys.argv[1:])
except SystemExit:  # --help
    pass
print(json.dumps({m: m in sys.modules for m in ("torch", "pandas")}))
"""


@pytest.mark.parametrize("args", [("sandbox", "slurm", "status", "--dir", "{tmp}/none"),
                                  ("notebook", "--help"), ("lab", "--help"), ("datasets",),
                                  ("profiles", "--help"),
                                  ("model", "predict", "--model", "inception_small", "--workers", "1,8",
                                   "--algorithm", "allreduce,sync_ps,sgp,downpour,diloco,easgd",
                                   "--calibration", "{root}/results/reference/scaling/calibration.json")])
def test_commands_that_need_no_torch_do_not_import_it(tmp_path, args):
    """A command line builds only the parser of its command (the train parser's flags come from
    the algorithms, which import torch: ~2.5 s of CPU here), and what these commands run needs
    none of it: the performance model reads the algorithms' options and the models' registry,
    neither of which imports torch."""
    argv = [a.format(tmp=tmp_path, root=ROOT) for a in args]
    proc = subprocess.run([sys.executable, "-c", LOADED, *argv], env=launch_env(), cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert loaded["torch"] is False, explain(proc)


def test_a_notebook_kernel_plans_studies_without_torch():
    """A notebook's kernel plans its runs, sends them to the engines and draws what comes back;
    the engines train. What the kernel imports for that (the config and its checks, the data
    catalog, the studies, their figures, the model beside them) imports no torch: ~2.5 s of
    CPU a kernel here, and a study's planner under ``downpour study`` saves the same."""
    code = ("import json, sys\n"
            "from downpour_lib import notebooks\n"
            "from downpour_lib.config import TrainConfig\n"
            "from downpour_lib.study import emulated_check, model_plots, scaling_plots\n"
            "from downpour_lib.study.studies import Scaling, run_emulated_sweep, run_study\n"
            "from downpour_lib.study.scaling import study_spec\n"
            "assert len(study_spec(['sync_ps', 'allreduce'], [1, 2], {'steps': 3}, {}, "
            "csv='runs.csv').plan()) == 12\n"
            "TrainConfig(algorithm='downpour', dataset='mnist1d').options.roles_for(3)\n"
            "print(json.dumps('torch' in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], env=launch_env(), capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, explain(proc)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) is False, explain(proc)


def test_a_training_rank_loads_pandas_only_where_it_makes_the_tables():
    """Rank 0 builds the run's frames at its end; a rank that only trains never needs pandas
    (0.3 s of CPU a rank here)."""
    code = ("import json, sys\nfrom downpour_lib.engine import Trainer\n"
            "print(json.dumps({'pandas': 'pandas' in sys.modules, 'torch': 'torch' in sys.modules}))")
    proc = subprocess.run([sys.executable, "-c", code], env=launch_env(), capture_output=True,
                          text=True, timeout=120)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"pandas": False, "torch": True}, \
        explain(proc)


def test_downpour_train_imports_torch_with_the_collector_paused_and_frozen(tmp_path):
    """A rank imports torch and torch._dynamo (an optimizer's step imports it) with Python's
    cyclic collector paused, then freezes that heap (downpour_lib/_torch_import.py: a third less
    CPU a rank here). The collector is on again for the run, as it was found; a process that had
    it off keeps it off; a second call changes nothing."""
    code = ("import gc, json, sys\n"
            "from downpour_lib._torch_import import import_torch\n"
            "from downpour_lib.cli import main\n"
            "assert 'torch' not in sys.modules\n"
            "assert main(['train', '--steps', '3', '--output-dir', sys.argv[1]]) == 0\n"
            "seen = {'enabled': gc.isenabled(), 'frozen': gc.get_freeze_count(),\n"
            "        'dynamo': 'torch._dynamo' in sys.modules}\n"
            "gc.disable(); frozen = gc.get_freeze_count(); import_torch()\n"
            "seen['again'] = [gc.isenabled(), gc.get_freeze_count() == frozen]\n"
            "print(json.dumps(seen))")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run")], env=launch_env(),
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, explain(proc)
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["enabled"] is True and seen["dynamo"] is True, explain(proc)
    assert seen["frozen"] > 100_000, explain(proc)  # torch's import: ~500,000 objects
    assert seen["again"] == [False, True], explain(proc)


def caught(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler for ``signum`` (its SigCgt mask in /proc)."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(mask, 16) >> (signum - 1) & 1)


@pytest.mark.parametrize("entry", [[str(BIN / "downpour")], [sys.executable, "-m", "downpour_lib"]],
                         ids=["downpour", "python -m downpour_lib"])
def test_downpour_train_holds_usr2_while_it_imports_torch(entry):
    """The ``downpour`` entry point holds USR2 before torch is loaded (no libtorch in the
    process's maps when the handler shows up), so a USR2 during the seconds of that import
    stops the run before its first step (status PREEMPTED) instead of killing it. So does
    ``python -m downpour_lib``, which the studies and ``bench train`` launch their ranks with."""
    proc = subprocess.Popen([*entry, "train", "--algorithm", "local", "--model", "mlp",
                             "--dataset", "digits", "--steps", "50", "--threads", "1"],
                            env=launch_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        deadline, maps = time.monotonic() + 120, None
        while proc.poll() is None and time.monotonic() < deadline:
            if caught(proc.pid, signal.SIGUSR2):
                maps = Path(f"/proc/{proc.pid}/maps").read_text()  # after: libtorch not yet in it
                break
            time.sleep(0.001)
        assert maps is not None, "downpour train never held USR2"
        assert "libtorch" not in maps, "USR2 was held only after torch was loaded"
        os.kill(proc.pid, signal.SIGUSR2)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == preempt.PREEMPTED, out[-3000:]
    assert "preempted after 0 of 50 steps" in out, out[-3000:]
