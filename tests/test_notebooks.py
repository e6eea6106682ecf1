"""The notebooks: committed clean (no outputs, a `parameters` cell, no logic), and every one executed
headless on a 2-engine local-mpi cluster with tiny parameters, its results checked."""

import ast
import json
import math
import shutil
import signal
import subprocess
from pathlib import Path

import nbformat
import pandas as pd
import pytest
from conftest import BIN, ROOT, downpour, explain, ipcluster_daemon, launch_env

from downpour_lib.errors import ConfigError
from downpour_lib.notebooks import NotebookError, inject_parameters, parameter_names, run_notebook

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
LOGIC = (ast.FunctionDef, ast.ClassDef, ast.For, ast.While, ast.If, ast.Try, ast.Lambda,
         ast.ListComp, ast.DictComp, ast.GeneratorExp)


def test_the_suite_is_there():
    assert [nb.name for nb in NOTEBOOKS] == ["00_cluster_quickstart.ipynb", "01_train_sync_ps.ipynb",
                                             "02_scaling_study.ipynb", "03_downpour_staleness.ipynb",
                                             "04_gossip_consensus.ipynb",
                                             "05_time_to_accuracy.ipynb", "06_at_scale.ipynb",
                                             "07_lm_time_to_loss.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_without_outputs_with_parameters_and_no_logic(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.outputs == [] and c.execution_count is None for c in code), "strip the outputs"
    tagged = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and parameter_names(tagged[0].source)
    for cell in code:
        python = "\n".join(line for line in cell.source.splitlines() if not line.startswith("%"))
        found = [type(n).__name__ for n in ast.walk(ast.parse(python)) if isinstance(n, LOGIC)]
        assert not found, f"logic belongs in downpour_lib, not in a notebook cell: {found}\n{cell.source}"


def test_parameters_are_injected_after_the_parameters_cell_and_checked():
    nb = nbformat.read(ROOT / "notebooks" / "01_train_sync_ps.ipynb", as_version=4)
    injected = inject_parameters(nb, {"steps": 7, "model": "mlp"})
    index = next(i for i, c in enumerate(injected.cells) if "parameters" in c.metadata.get("tags", []))
    assert injected.cells[index + 1].metadata["tags"] == ["injected-parameters"]
    assert "steps = 7\nmodel = 'mlp'" in injected.cells[index + 1].source
    assert len(injected.cells) == len(nb.cells) + 1  # the original is untouched
    with pytest.raises(ConfigError, match="parameter='stepz'"):
        inject_parameters(nb, {"stepz": 7})


@pytest.mark.parametrize("notebook, parameters, message, cell", [
    ("02_scaling_study", {"algorithms": ["nope"]},
     "ConfigError: algorithms='nope' is not valid: choose from local, sync_ps", "study_spec("),
    ("06_at_scale", {"preset": "nope"},
     "ConfigError: preset='nope' is not valid: choose one of ddp-bench-dgx1, dgx-a100, "
     "dgx-a100-40g-dali", "map_preset("),
    ("07_lm_time_to_loss", {"target": 0, "network": "local"},
     "ConfigError: target=0 is not valid: a validation loss per token > 0", "plan_study("),
])
def test_a_bad_parameter_fails_the_first_cell_that_uses_it_with_one_line(tmp_path, notebook,
                                                                         parameters, message, cell):
    """The message the command line gives (field, value, what works), not a traceback through the
    library, from the first cell after the parameters (before any cluster or measurement)."""
    with pytest.raises(NotebookError) as failed:
        run_notebook(ROOT / "notebooks" / f"{notebook}.ipynb", {**parameters, "out": str(tmp_path)})
    text = str(failed.value)
    assert message in text and "Traceback" not in text and "File " not in text, text
    failing = text.split("------------------")[1]
    assert cell in failing, text
    assert not any(tmp_path.iterdir())  # nothing measured, nothing written


@pytest.fixture(autouse=True)
def no_cluster_left():
    """A notebook that fails half-way must not leave its engines running: its kernel's exit stops
    the cluster, and whatever a killed kernel left in the profile is stopped here."""
    yield
    from downpour_lib.cluster import stop_clusters

    stop_clusters("local-mpi")


def outputs(nb, contains: str) -> str:
    """The text output of the first code cell whose source contains ``contains``."""
    cell = next(c for c in nb.cells if c.cell_type == "code" and contains in c.source)
    return "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in cell.outputs)


def images(nb) -> int:
    return sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code"
               for o in c.outputs)


def test_00_cluster_quickstart():
    nb = run_notebook(ROOT / "notebooks" / "00_cluster_quickstart.ipynb", {"engines": 2})
    assert "starting a local-mpi cluster of 2 engines" in outputs(nb, "cluster = use_cluster(")
    hello = outputs(nb, "remote.hello()")
    assert "hello from rank 0 of 2" in hello and "hello from rank 1 of 2" in hello
    allreduce = outputs(nb, "cluster.allreduce()")
    assert allreduce.count("3.0") == 2, allreduce  # 1 + 2 on both ranks


def cluster_notebook(path: Path, *cells: str) -> Path:
    """A notebook at ``path``: ``engines = 2`` (its parameters cell), ``use_cluster``, ``cells``,
    and ``cluster.stop()``."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("engines = 2", metadata={"tags": ["parameters"]})]
    nb.cells += [nbformat.v4.new_code_cell(source) for source in (
        "from downpour_lib.cluster import use_cluster\ncluster = use_cluster('local-mpi', n=engines)",
        *cells, "cluster.stop()")]
    nbformat.write(nb, path)
    return path


def test_px_shows_every_engines_output_also_when_it_came_before_the_cell_looked(tmp_path):
    """A kernel busy elsewhere (the browser test beside make test's workers) reads a quick %px's
    replies late, when every engine's output is already in. ipyparallel's streamed %px then showed
    the last engine's alone (CI: rank 1's hello): its replay of early output gives every engine one
    display id. Here the kernel reads late on purpose: the view's execute waits for the output."""
    notebook = cluster_notebook(
        tmp_path / "late.ipynb",
        "%px import downpour_lib.cluster.remote as remote",
        "send = cluster._view.execute\n"
        "def execute_and_read_late(*args, **kwargs):\n"
        "    result = send(*args, **kwargs)\n"
        "    assert result.wait_for_output(60), 'no output from the engines in 60 s'\n"
        "    return result\n"
        "cluster._view.execute = execute_and_read_late",
        "%px print(remote.hello())")
    hello = outputs(run_notebook(notebook), "remote.hello()")
    assert "hello from rank 0 of 2" in hello and "hello from rank 1 of 2" in hello, hello


def test_an_interrupted_px_cell_ends_though_its_engines_ignore_the_interrupt(tmp_path):
    """Ctrl-C on a %px cell whose engines do not stop (stuck in C, or ignoring SIGINT): ipyparallel
    sends them the signal and the cell ends, so the kernel can stop or restart them. With its
    output shown only when done (our mend for the lost output before), the cell waited for the
    engines' output instead, here 10 minutes. Output streamed before the interrupt is kept, and
    restart_engines ends the engines that ignored it."""
    notebook = cluster_notebook(
        tmp_path / "interrupt.ipynb",
        # the kernel interrupts itself (what Ctrl-C sends it) once both engines' lines, printed
        # after they turned SIGINT off, have reached it (the %px magics' last result)
        "import os, signal, threading, time\n"
        "px = get_ipython().magics_manager.registry['ParallelMagics']\n"
        "def asleep():\n"
        "    result = px.last_result\n"
        "    return 0 if result is None else sum('asleep' in (out or '') for out in result.stdout)\n"
        "def interrupt_when_asleep():\n"
        "    while asleep() < engines:\n"
        "        time.sleep(0.2)\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "threading.Thread(target=interrupt_when_asleep, daemon=True).start()",
        "%%px\n"
        "import signal, time\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "print('asleep', flush=True)\n"
        "time.sleep(600)",
        "print('the kernel is back')\ncluster.restart_engines()",  # ends the sleepers
        "%px print('awake again')")
    done = run_notebook(notebook, timeout_s=300)
    assert "the kernel is back" in outputs(done, "the kernel is back"), done.cells[-1]
    px = outputs(done, "time.sleep(600)")
    assert "Sending signal SIGINT to engines" in px, px
    assert px.count("asleep") == 2, px  # each engine's line, streamed before the interrupt
    assert outputs(done, "awake again").count("awake again") == 2


def test_00_uses_the_cluster_started_before_it_and_leaves_it_running(tmp_path):
    """The intended workflow: `ipcluster start --profile=local-mpi -n 2 --daemonize`, then the
    notebook, from the command line. It uses that cluster (it refused it: ClusterError, 24 lines),
    leaves it running, says what ran and keeps the executed notebook under
    results/<host>/notebooks/ beside the notebook's results; a count of engines the cluster does
    not have is one line, exit 2, saying what it has."""
    from downpour_lib.cluster import ensure_profile, running_clusters, stop_clusters
    from downpour_lib.cluster.profiles import profile_dir
    from downpour_lib.study.core import host_dirname

    notebook = tmp_path / "notebooks" / "00_cluster_quickstart.ipynb"
    notebook.parent.mkdir()
    shutil.copy(ROOT / "notebooks" / notebook.name, notebook)
    ensure_profile("local-mpi")
    ipcluster = [str(BIN / "ipcluster"), "--profile=local-mpi"]
    try:
        ipcluster_daemon("local-mpi", 2)
        [started] = [c.cluster_id for c in running_clusters("local-mpi")]

        proc = downpour("notebook", "run", str(notebook), "-p", "engines=2", timeout=600)
        assert proc.returncode == 0, explain(proc)
        saved = tmp_path / "results" / host_dirname() / "notebooks" / notebook.name
        assert f"using the running local-mpi cluster (id {started!r}, 2 engines)" in proc.stdout
        assert proc.stdout.startswith(f"downpour notebook: running {notebook} with engines=2\n")
        assert f"executed notebook, with its outputs and figures: {saved}" in proc.stdout
        executed = nbformat.read(saved, as_version=4)
        assert "hello from rank 0 of 2" in outputs(executed, "remote.hello()")
        assert [c.cluster_id for c in running_clusters("local-mpi")] == [started]  # left running

        # a cluster file whose processes are gone (a cluster killed, not stopped): ipyparallel's
        # ERRORs for it, as the kernel loads it, stood above the one line
        security = profile_dir("local-mpi") / "security"
        gone = json.loads((security / f"cluster-{started}.json").read_text())
        gone["cluster"]["cluster_id"] = "gone"
        never = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # no process has this pid
        gone["controller"]["state"]["pid"] = never
        for engine_set in gone["engines"]["sets"].values():
            engine_set["pid"] = never
        (security / "cluster-gone.json").write_text(json.dumps(gone))
        wrong = downpour("notebook", "run", str(notebook), "-p", "engines=3", "--no-save",
                         timeout=600)
        assert wrong.returncode == 2, explain(wrong)
        lines = wrong.stderr.strip().splitlines()
        assert len(lines) == 1, explain(wrong)
        [line] = lines
        assert line.startswith("downpour notebook: error: 00_cluster_quickstart.ipynb: engines=3 is "
                               "not valid: profile 'local-mpi' runs a cluster of 2 engines"), line
        assert "ask for 2 (engines=2)" in line and "Traceback" not in wrong.stdout + wrong.stderr
        assert [c.cluster_id for c in running_clusters("local-mpi")] == [started]
        assert not (security / "cluster-gone.json").exists()  # forgotten as it was read
    finally:
        subprocess.run([ipcluster[0], "stop", ipcluster[1]], env=launch_env(), capture_output=True,
                       text=True, timeout=120)
        stop_clusters("local-mpi")


@pytest.mark.parametrize("source, message", [
    ("import time\ntime.sleep(120)", "cell [2] ran past the limit of 5 s a cell and was stopped: give "
                                     "a longer --timeout"),
    ("import os\nos._exit(3)", "the kernel died in cell [2] (killed, or out of memory)"),
])
def test_a_cell_past_its_timeout_or_a_dead_kernel_is_one_line_naming_the_cell(tmp_path, source,
                                                                              message):
    """A headless run that stops in a cell says which cell and why in one line, keeps the notebook
    it executed up to there, and exits 1; a timeout that is no limit is refused before it runs."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1"),
                                         nbformat.v4.new_code_cell(source)])
    path, saved = tmp_path / "stops.ipynb", tmp_path / "saved.ipynb"
    nbformat.write(nb, path)
    proc = downpour("notebook", "run", str(path), "--output", str(saved), "--timeout", "5", timeout=300)
    assert proc.returncode == 1, explain(proc)
    line = f"downpour notebook: stops.ipynb: {message}"
    assert line in proc.stderr and "Traceback" not in proc.stderr, explain(proc)
    assert f"(the executed notebook, up to the failing cell: {saved})" in proc.stderr, explain(proc)
    assert nbformat.read(saved, as_version=4).cells[0].execution_count == 1
    proc = downpour("notebook", "run", str(path), "-p", "x=2", timeout=120)
    assert proc.returncode == 2 and f"notebook={str(path)!r} is not valid: it needs a code cell tagged " \
        "`parameters` holding its defaults (-p sets those)" in proc.stderr, explain(proc)
    for bad in ("0", "-5", "nan"):
        proc = downpour("notebook", "run", str(path), "--timeout", bad, timeout=120)
        assert proc.returncode == 2 and f"--timeout={float(bad):g} is not valid: seconds a cell may " \
            "run, > 0" in proc.stderr, explain(proc)


def test_ctrl_c_interrupts_the_cell_and_stops_the_cluster_the_notebook_started(tmp_path):
    """Ctrl-C on `downpour notebook run` (SIGINT to it alone: its kernel runs in a session of its
    own) interrupts the running cell, as JupyterLab's stop button does; the kernel then shuts down
    and stops the cluster the notebook started, and the run says where it stopped, exit 130.
    nbclient's own handler killed the kernel, printed three tracebacks and left the cluster."""
    from downpour_lib.cluster import running_clusters

    cells = ["from downpour_lib.cluster import use_cluster\ncluster = use_cluster('local-mpi', 2)",
             "import time\nprint('sleeping', flush=True)\ntime.sleep(600)", "cluster.stop()"]
    path, saved = tmp_path / "waits.ipynb", tmp_path / "saved.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells]), path)
    run = subprocess.Popen([str(BIN / "downpour"), "notebook", "run", str(path), "--output", str(saved)],
                           env=launch_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           cwd=ROOT, start_new_session=True)
    try:
        lines = []
        for line in run.stdout:  # the cluster started, and the second cell runs
            lines.append(line)
            if line.startswith("sleeping"):
                break
        assert running_clusters("local-mpi"), "".join(lines)
        run.send_signal(signal.SIGINT)
        out, err = run.communicate(timeout=180)
    finally:
        run.kill()
    assert run.returncode == 130, (lines, out, err)
    assert err.strip().endswith(f"downpour notebook: waits.ipynb: interrupted in cell [2]; the executed "
                                f"notebook, up to there: {saved}") and "Traceback" not in err, err
    assert nbformat.read(saved, as_version=4).cells[1].outputs[0]["text"] == "sleeping\n"
    assert running_clusters("local-mpi") == []  # its kernel's exit stopped it


def test_notebook_run_says_where_and_keeps_nothing_with_no_save(tmp_path):
    """Notebook 00 with no cluster running: it starts one and stops it; --no-save keeps no
    executed notebook, and says so."""
    from downpour_lib.cluster import running_clusters

    notebook = tmp_path / "notebooks" / "00_cluster_quickstart.ipynb"
    notebook.parent.mkdir()
    shutil.copy(ROOT / "notebooks" / notebook.name, notebook)
    proc = downpour("notebook", "run", str(notebook), "-p", "engines=2", "--no-save", timeout=600)
    assert proc.returncode == 0, explain(proc)
    assert "starting a local-mpi cluster of 2 engines (none runs; stop() stops it)" in proc.stdout
    assert "executed notebook not saved (--no-save)" in proc.stdout, explain(proc)
    assert not (tmp_path / "results").exists() and running_clusters("local-mpi") == []


def test_01_train_sync_ps():
    nb = run_notebook(ROOT / "notebooks" / "01_train_sync_ps.ipynb",
                      {"engines": 2, "model": "mlp", "steps": 10, "eval_every": 5})
    summary = outputs(nb, "result = cluster.train(config)")
    assert "sync_ps" in summary and "world_size" in summary
    assert images(nb) == 2  # the curves and the breakdown
    timeline = outputs(nb, "from dataclasses import replace")  # the trace: the server's updates too
    assert "trace.json at https://ui.perfetto.dev" in timeline
    assert all(kind in timeline for kind in ("forward+backward", "update N", "step N")), timeline


def test_02_scaling_study_writes_the_csv_and_figures_and_resumes(tmp_path):
    params = {"algorithms": ["sync_ps", "ddp"], "engines": 2, "workers": [1, 2], "repeats": 2,
              "out": str(tmp_path),
              "overrides": {"model": "mlp", "dataset": "synthetic-mnist", "batch_size": 16, "steps": 6,
                            "warmup_steps": 2},
              "options": {"sync_ps": {"server": "colocated"}},  # 1 and 2 ranks for both: 2 engines
              "emulated_workers": [1, 2], "emulated_algorithms": ["ddp"],
              "emulated_step_s": [0.02], "emulated_repeats": 1}
    nb = run_notebook(ROOT / "notebooks" / "02_scaling_study.ipynb", params)
    everything = pd.read_csv(tmp_path / "runs.csv")
    emulated = everything[everything.compute == "emulated"]  # a series of its own, labelled
    assert sorted(emulated.world_size) == [1, 2] and (emulated.emulated_step_s == 0.02).all()
    assert emulated.final_train_loss.isna().all() and (emulated.samples_per_s > 0).all()
    runs = everything[everything.compute == "real"]
    pairs = sorted(zip(runs.algorithm, runs.world_size, runs["repeat"], strict=True))
    assert pairs == sorted((a, n, r) for a in ("ddp", "sync_ps") for n in (1, 2) for r in (0, 1))
    assert (runs.samples_per_s > 0).all() and (runs["options.server"].dropna() == "colocated").all()
    assert runs.cores.notna().all() and runs.cpu_model.notna().all()
    figures = sorted(p.name for p in (tmp_path / "figures").iterdir())
    assert figures == ["breakdown.png", "efficiency.png", "scaling_model.png", "speedup.png",
                       "throughput.png"]
    assert images(nb) == 5
    assert "samples_per_s_std" in outputs(nb, "plots.scaling_table(runs)")
    assert "predicted_step_s" in outputs(nb, "emulated_vs_model(")  # the emulated points' model
    # the model's curves: both algorithms from 1 to 1,024 workers, each row naming its calibration
    predictions = pd.read_csv(tmp_path / "predictions.csv")
    assert sorted(set(zip(predictions.algorithm, predictions.workers, strict=True))) == \
        sorted((a, n) for a in ("ddp", "sync_ps") for n in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024))
    assert (predictions.calibration == "measured-" + runs.host.iloc[0]).all()
    assert predictions.calibration_source.str.contains("collectives.json").all()
    measured_links = (tmp_path / "collectives.json").stat().st_mtime

    before = (tmp_path / "runs.csv").read_text()
    again = run_notebook(ROOT / "notebooks" / "02_scaling_study.ipynb", params)
    assert "all 8 runs are already in" in outputs(again, "runs = run_study(")
    assert (tmp_path / "runs.csv").read_text() == before
    assert (tmp_path / "collectives.json").stat().st_mtime == measured_links  # measured once


def test_03_downpour_staleness(tmp_path):
    colocated = {"server": "colocated", "warmstart": 0}  # every run on the 2 engines, 2 workers each
    params = {"engines": 2, "workers": 2, "model": "mlp", "steps": 20, "batch_size": 16,
              "eval_every": 5, "sync_ps": {"server": "colocated"},
              "variants": [{"servers": 1, "n_fetch": 1, "n_push": 1, **colocated},
                           {"servers": 2, "n_fetch": 2, "n_push": 2, **colocated}],
              "out": str(tmp_path)}
    nb = run_notebook(ROOT / "notebooks" / "03_downpour_staleness.ipynb", params)
    runs = pd.read_csv(tmp_path / "runs.csv").set_index("label")
    downpour = ["downpour S=1 fetch=1 push=1 colocated", "downpour S=2 fetch=2 push=2 colocated"]
    assert list(runs.index) == ["sync_ps colocated", *downpour]
    assert (runs.world_size == 2).all() and (runs.workers == 2).all() and list(runs.servers) == [1, 1, 2]
    assert (runs.samples_per_s > 0).all() and (runs.test_accuracy > 0.1).all()
    assert runs.loc[downpour, ["staleness_mean", "staleness_max"]].notna().all().all()
    assert runs.loc["sync_ps colocated", ["staleness_mean", "staleness_max"]].isna().all()
    staleness = pd.read_csv(tmp_path / "staleness.csv")
    updates = staleness.groupby("label", sort=False).updates.sum()
    # every push is applied and recorded: 2 workers x 20 pushes; 2 workers x 10 pushes x 2 shards
    assert list(updates.index) == downpour and list(updates) == [40, 40]
    evals = pd.read_csv(tmp_path / "evals.csv")
    assert set(evals.label) == set(runs.index) and (evals.groupby("label").size() == 4).all()
    assert "downpour S=2 fetch=2 push=2 colocated" in outputs(nb, "study.table()")
    assert images(nb) == 3  # accuracy against time, throughput, staleness
    assert sorted(p.name for p in (tmp_path / "figures").glob("*.png")) == [
        "accuracy_vs_time.png", "staleness.png", "throughput.png"]


def test_04_gossip_consensus(tmp_path):
    topologies = ["exponential", "ring", "complete"]
    algorithms = ["sgp", "osgp", "dpsgd", "adpsgd", "allreduce"]
    nb = run_notebook(ROOT / "notebooks" / "04_gossip_consensus.ipynb",
                      {"engines": 2, "model": "mlp", "steps": 20, "eval_every": 5, "world_sizes": [1, 2],
                       "algorithms": algorithms, "topologies": topologies, "out": str(tmp_path)})
    runs, evals = pd.read_csv(tmp_path / "runs.csv"), pd.read_csv(tmp_path / "evals.csv")
    for topology in topologies:  # a consensus-distance curve per graph, at every evaluation
        curve = evals[(evals.algorithm == "sgp") & (evals.topology == topology) & (evals.world_size == 2)]
        assert list(curve.step) == [4, 9, 14, 19], topology
        assert curve.consensus_distance.notna().all() and (curve.consensus_distance >= 0).all()
    # a row per algorithm (on its default graph) at each world size, plus sgp on the other graphs
    assert sorted(zip(runs.algorithm, runs.world_size, strict=True)) == sorted(
        [(a, n) for a in algorithms for n in (1, 2)] + [("sgp", 2)] * 2)
    assert (runs.test_accuracy > 0.3).all()  # 20 steps of mlp on digits: well above chance (0.1)
    at_two = runs[runs.world_size == 2].set_index("algorithm")
    assert (at_two.loc[["sgp", "osgp", "dpsgd", "adpsgd"]].bytes_sent_per_step > 0).all()
    assert (runs[runs.world_size == 1].bytes_sent_per_step == 0).all()  # nobody to talk to
    table = outputs(nb, "summary_table(runs)")
    assert all(a in table for a in algorithms) and "final_consensus_distance" in table
    assert images(nb) == 3  # consensus, accuracy against time, bytes per step


def test_05_time_to_accuracy(tmp_path):
    """Local ranks (the sandbox's runs are tested in test_slurm_nodes.py): allreduce and localsgd
    (period 4) at 2 workers, with and without a straggler at 3x. Local SGD sends a quarter of
    allreduce's bytes; each run records its straggler setting; a table of seconds and
    megabytes to the target, both figures; run again, nothing is measured twice."""
    params = {"algorithms": ["allreduce", "localsgd"], "workers": 2, "network": "local",
              "stragglers": [0, 1], "slowdown": 3.0, "epochs": 1, "eval_every": 10, "target": 0.2,
              "out": str(tmp_path)}
    nb = run_notebook(ROOT / "notebooks" / "05_time_to_accuracy.ipynb", params)
    runs = pd.read_csv(tmp_path / "runs.csv")
    assert len(runs) == 4 and (runs.network == "local").all() and (runs.link == "local").all()
    assert (runs.total_steps == 62).all()  # 4,000 samples / (2 x 32)
    assert (runs.test_accuracy > 0.2).all()  # 62 steps of MNIST-1D: above chance (0.1)
    rows = runs.set_index(["algorithm", "slow_workers"])
    sent = rows.bytes_sent_total
    assert sent[("localsgd", 0)] / sent[("allreduce", 0)] == pytest.approx(0.25, abs=0.03)
    # the straggler setting reaches the runs (its sleep is checked per rank in test_periodic.py)
    assert rows.slowdown.to_dict() == {(a, k): 3.0 if k else 1.0 for a, k in rows.index}
    assert (runs.time_to_target_s > 0).all() and (runs.bytes_to_target > 0).all()
    evals = pd.read_csv(tmp_path / "evals.csv").groupby("run_id")
    assert (evals.size() == 7).all()  # every 10 steps, and the last
    assert all(g.bytes_sent.is_monotonic_increasing for _, g in evals)
    table = outputs(nb, "study.table()")
    assert "time_to_target_s" in table and "mb_to_target" in table and "local, 1 slow x3" in table
    assert images(nb) == 2  # accuracy against time, against bytes
    assert sorted(p.name for p in (tmp_path / "figures").glob("*.png")) == [
        "accuracy_vs_bytes.png", "accuracy_vs_time.png"]

    before = (tmp_path / "runs.csv").read_text()
    again = run_notebook(ROOT / "notebooks" / "05_time_to_accuracy.ipynb", params)
    assert "all 4 runs are already in" in outputs(again, "measured = run_study")
    assert (tmp_path / "runs.csv").read_text() == before


def test_07_lm_time_to_loss(tmp_path):
    """The language model's time-to-loss study on local ranks (the sandbox's runs are notebook
    05's code path, tested in test_slurm_nodes.py): allreduce and localsgd (period 4) at 2 workers,
    8 steps of gpt-nano, to a validation loss of 5.0 (uniform over the 256 bytes is 5.55), each
    evaluation on 128 of the 625 validation windows. Both reach it at the first evaluation; local
    SGD sends a quarter of allreduce's bytes; the model's prediction beside each run; the loss
    figures and the table."""
    params = {"algorithms": ["allreduce", "localsgd"], "workers": 2, "network": "local",
              "steps": 8, "eval_every": 4, "eval_samples": 128, "target": 5.0, "out": str(tmp_path)}
    nb = run_notebook(ROOT / "notebooks" / "07_lm_time_to_loss.ipynb", params)
    runs = pd.read_csv(tmp_path / "runs.csv")
    assert len(runs) == 2 and (runs.network == "local").all() and (runs.model == "gpt-nano").all()
    assert (runs.target_loss == 5.0).all() and "target_accuracy" not in runs
    assert (runs.eval_samples == 128).all()
    assert (runs.test_loss < math.log(256)).all()  # below a uniform guess over the bytes
    assert list(runs.test_perplexity) == pytest.approx([math.exp(v) for v in runs.test_loss])
    assert (runs.steps_to_target == 4).all()  # the first evaluation, after step 3
    assert (runs.time_to_target_s > 0).all() and (runs.bytes_to_target > 0).all()
    assert (runs.train_s_to_target < runs.time_to_target_s).all()  # no evaluation in it
    sent = runs.set_index("algorithm").bytes_sent_total
    assert sent["localsgd"] / sent["allreduce"] == pytest.approx(0.25, abs=0.03)
    evals = pd.read_csv(tmp_path / "evals.csv").groupby("run_id")
    assert (evals.size() == 2).all()  # after steps 3 and 7
    predictions = pd.read_csv(tmp_path / "predictions.csv").set_index("algorithm")
    assert set(predictions.run_id) == set(runs.run_id)
    assert (predictions.predicted_time_to_target_s > 0).all()
    assert predictions.predicted_comm_s["localsgd"] < predictions.predicted_comm_s["allreduce"]
    table = outputs(nb, "study.table()")
    assert "predicted_time_to_target_s" in table and "test_loss" in table
    assert images(nb) == 4  # loss against time and bytes, time and bytes to the target
    assert sorted(p.name for p in (tmp_path / "figures").glob("*.png")) == [
        "bytes_to_target.png", "loss_vs_bytes.png", "loss_vs_time.png", "time_to_target.png"]


def test_06_at_scale(tmp_path):
    """The model calibrated on the committed scaling and staleness references, with the link the
    study's machine measured (its committed collectives: on a busy machine one measured now put
    sync_ps's traffic at 14 times its time on that link, and sync_ps 15% off; test_perfmodel.py
    measures one here): every measured point predicted, the simulated staleness beside the
    measured, the published table and its figure, the curves and the map, all written to
    ``out``."""
    study = ROOT / "results" / "reference" / "scaling"
    nb = run_notebook(ROOT / "notebooks" / "06_at_scale.ipynb",
                      {"out": str(tmp_path), "gbits": [1, 100],
                       "collectives": str(study / "collectives.json")})
    reference = pd.read_csv(study / "runs.csv")
    comparison = pd.read_csv(tmp_path / "comparison.csv")
    assert set(zip(comparison.algorithm, comparison.workers, strict=True)) == \
        set(zip(reference.algorithm, reference.num_workers, strict=True))
    assert comparison.error.abs().max() < 0.15, comparison.to_string()
    staleness = pd.read_csv(tmp_path / "staleness.csv")
    assert len(staleness) == 5 and staleness.agrees.all(), staleness.to_string()
    assert "Horovod VGG-16" in outputs(nb, "presets.published_table()")
    for name in ("calibration.json", "predictions.csv"):
        assert (tmp_path / name).is_file(), name
    assert not (tmp_path / "collectives.json").exists()  # given, so nothing measured
    assert sorted(p.name for p in (tmp_path / "figures").glob("*.png")) == [
        "fastest.png", "published.png", "scaling_model.png", "staleness_model.png"]
    assert images(nb) == 4


def test_this_machines_results_are_git_ignored_and_the_committed_ones_are_not():
    """What `make study` and `downpour notebook run` write under results/<host>/ stays out of
    `git status`; every committed file under results/ (results/reference/) is not ignored."""
    from downpour_lib.study.core import host_dirname

    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")

    def ignored(*paths: str) -> set[str]:
        proc = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=ROOT,
                              input="\n".join(paths), capture_output=True, text=True, timeout=60)
        assert proc.returncode in (0, 1), explain(proc)
        return set(proc.stdout.split())

    mine = [f"results/{host_dirname()}/{p}" for p in ("scaling/runs.csv", "notebooks/01.ipynb",
                                                      "model/figures/fastest.png")]
    assert ignored(*mine) == set(mine)
    committed = subprocess.run(["git", "ls-files", "results"], cwd=ROOT, capture_output=True,
                               text=True, timeout=60).stdout.split()
    assert committed and ignored(*committed) == set()
