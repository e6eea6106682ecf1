"""The scaling study: real runs, on the engines of a local-mpi cluster as `make study` runs them, into
one tidy CSV per machine, resumable, repeated, and figures from the CSV; the committed reference names
its machine and a study here never touches it. (The same study under mpiexec, row for row:
test_cluster.py's test_the_study_csv_does_not_depend_on_the_launcher.)"""

import os
import shutil
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import ROOT

from downpour_lib import provenance
from downpour_lib.cli import main
from downpour_lib.config import TrainConfig
from downpour_lib.errors import ConfigError
from downpour_lib.study.scaling import (
    REFERENCE_DIR,
    SCALING_BASE,
    StudySpec,
    run_id,
    study_dir,
    workload,
)
from downpour_lib.study.scaling_plots import make_figures, throughput_figure
from downpour_lib.study.scaling_runs import (
    DODGE,
    dodged,
    load_runs,
    one_workload,
    other_workloads,
    ranks_exceed_cores,
    scaling_table,
)
from downpour_lib.study.studies import Scaling, run_study

TINY = {"model": "mlp", "dataset": "synthetic-mnist", "batch_size": 16, "steps": 6,
        "warmup_steps": 2, "eval_every": 0, "final_eval": False, "threads": 1}
REFERENCE = ROOT / REFERENCE_DIR


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """A 2-repeat study of sync_ps and ddp at 1 and 2 workers, in this machine's directory of a
    results tree that also holds a copy of the committed reference, on a local-mpi cluster started
    for it (3 engines, the largest run's ranks; the engines import torch once for the 8 runs, where
    8 mpiexec launches started 16 ranks that did, 5-6 s of CPU each here)."""
    root = tmp_path_factory.mktemp("results")
    shutil.copytree(REFERENCE, root / "reference")
    spec = StudySpec(algorithms=("sync_ps", "ddp"), workers=(1, 2), base=TINY, repeats=2,
                     csv=str(study_dir(root=root) / "runs.csv"))
    log: list[str] = []
    runs = run_study(Scaling(spec, profile="local-mpi"), log=log.append)
    return root, spec, runs, log


def test_sweep_writes_one_row_per_run_and_repeat(study):
    _, spec, runs, log = study
    assert len(runs) == 8 and runs.run_id.is_unique
    # repeat r of every point runs before repeat r + 1 of any
    assert list(runs["repeat"]) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert (runs.groupby(["algorithm", "num_workers"])["repeat"].apply(sorted) == [[0, 1]] * 4).all()
    by = runs[runs["repeat"] == 0].set_index(["algorithm", "num_workers"])
    assert by.loc[("sync_ps", 2), "world_size"] == 3 and by.loc[("ddp", 2), "world_size"] == 2
    for column in ("samples_per_s", "comm_s", "git_sha", "torch_version", "mpi_version", "hosts",
                   "batch_size", "options.server", "host", "cores", "cpu_model"):
        assert column in runs.columns
    assert (runs.samples_per_s > 0).all() and runs.test_loss.isna().all()  # no evaluation
    # the ranks ran this checkout's code on this machine
    assert (runs.git_sha == provenance.git_sha()).all()
    assert (runs.host == provenance.machine()["host"]).all() and (runs.cores == os.cpu_count()).all()


def test_sweep_resumes(study):
    _, spec, _, _ = study
    csv = spec.csv
    before = open(csv).read()
    log: list[str] = []
    run_study(Scaling(spec), log=log.append)  # everything is there already: nothing runs
    assert open(csv).read() == before and len(log) == 8 and all(s.startswith("skip") for s in log)


def test_a_study_here_keeps_the_reference_and_writes_its_own_directory(study):
    root, spec, runs, _ = study
    here = study_dir(root=root)
    assert here.parent.parent == root and here.name == "scaling" and here.parent.name != "reference"
    assert spec.csv == str(here / "runs.csv")
    for path in REFERENCE.rglob("*"):  # the copy of the reference is untouched
        if path.is_file():
            assert (root / "reference" / path.relative_to(REFERENCE)).read_bytes() == path.read_bytes()
    reference = pd.read_csv(root / "reference" / "runs.csv")
    assert not set(reference.run_id) & set(runs.run_id)


def test_a_fresh_clone_measures_every_run_the_reference_holds(tmp_path):
    """`make study` here, with the reference committed beside it: this machine's directory has no
    CSV yet, so every run of the study is pending, although the reference holds each of
    its points (same algorithm, ranks and repeat)."""
    shutil.copytree(REFERENCE, tmp_path / "reference")
    reference = pd.read_csv(tmp_path / "reference" / "runs.csv")
    workers = tuple(sorted(reference.num_workers.unique()))  # a bigger machine adds 4, 8, ...
    spec = StudySpec(workers=workers, csv=str(study_dir(root=tmp_path) / "runs.csv"))
    plan = spec.plan()
    points = ["algorithm", "world_size", "repeat"]
    assert set(map(tuple, plan[points].values)) == set(map(tuple, reference[points].values))
    assert not set(plan.run_id) & set(reference.run_id)
    assert not Path(spec.csv).exists()  # nothing is done here: run_study runs all of it


def test_error_bars_are_the_spread_of_the_repeats(study):
    _, _, runs, _ = study
    table = scaling_table(runs).set_index(["algorithm", "num_workers"])
    spread = runs.groupby(["algorithm", "num_workers"]).samples_per_s.agg(["mean", "std", "size"])
    assert (table.runs == 2).all()
    assert table.samples_per_s.to_dict() == pytest.approx(spread["mean"].to_dict())
    assert table.samples_per_s_std.to_dict() == pytest.approx(spread["std"].to_dict())
    ax = throughput_figure(runs).axes[0]
    bars = [c for c in ax.containers if c.has_yerr]
    assert len(bars) == 2  # one per algorithm
    for container, (name, part) in zip(bars, scaling_table(runs).groupby("algorithm"), strict=True):
        assert container.get_label() == name
        lines = container.lines[2][0].get_segments()  # one vertical segment per point
        heights = [(seg[1][1] - seg[0][1]) / 2 for seg in lines]
        assert heights == pytest.approx(list(part.samples_per_s_std))


def test_runs_with_more_ranks_than_cores_are_flagged(study):
    _, _, runs, _ = study
    flagged = ranks_exceed_cores(runs)
    assert (flagged == (runs.world_size > runs.cores)).all()  # one host here
    table = scaling_table(runs)
    ax = throughput_figure(runs).axes[0]
    handles, labels = ax.get_legend_handles_labels()
    rings = [h for h, label in zip(handles, labels, strict=True) if label.startswith("ringed: ranks > cores")]
    crowded = table[table.ranks_exceed_cores]
    assert len(rings) == (1 if len(crowded) else 0)
    if len(crowded):  # a ring around exactly the crowded points
        worst = crowded.world_size.max()
        assert f"{worst} ranks on {os.cpu_count()} cores" in labels[handles.index(rings[0])]
        assert sorted(map(tuple, rings[0].get_offsets())) == sorted(
            zip(dodged(table)[crowded.index], crowded.samples_per_s, strict=True))
    # the legend sits outside the axes, off the data
    fig = ax.figure
    fig.canvas.draw()
    legend, axes = ax.get_legend().get_window_extent(), ax.get_window_extent()
    assert legend.x0 >= axes.x1


def test_points_at_one_worker_count_are_dodged_apart(study):
    _, _, runs, _ = study
    ax = throughput_figure(runs).axes[0]
    xs = [c.lines[0].get_xdata() for c in ax.containers if c.has_yerr]
    for workers, at in zip(sorted(runs.num_workers.unique()), zip(*xs, strict=True), strict=True):
        assert len(set(at)) == len(at)  # no error bar behind another's
        assert all(abs(x - workers) <= DODGE / 2 + 1e-9 for x in at)  # still at its worker count


def test_figures_from_the_csv(study, tmp_path):
    _, spec, _, _ = study
    figures = make_figures(spec.csv, tmp_path / "figures")
    assert [f.name for f in figures] == ["throughput.png", "speedup.png", "efficiency.png",
                                         "breakdown.png"]
    assert all(f.read_bytes()[:4] == b"\x89PNG" for f in figures)


def test_the_committed_reference_names_its_machine_and_shows_a_small_spread():
    runs = pd.read_csv(REFERENCE / "runs.csv")
    for column in ("host", "cores", "cpu_model", "torch_version", "git_sha", "repeat"):
        assert runs[column].notna().all(), column
    assert runs.git_sha.nunique() == 1 and runs.host.nunique() == 1
    table = scaling_table(runs)
    assert (table.runs >= 3).all()
    # measured with the study's settings as they are now
    for key in ("model", "dataset", "batch_size", "steps", "warmup_steps", "threads"):
        assert (runs[key] == SCALING_BASE[key]).all(), key
    assert (runs.measured_steps == SCALING_BASE["steps"] - SCALING_BASE["warmup_steps"]).all()
    # downpour's workers ran side by side (no warmstart), so their summed rates are a throughput
    assert (runs[runs.algorithm == "downpour"]["options.warmstart"] == 0).all()
    # the repeats agree: the throughput's spread is a few percent of it at every point
    assert (table.samples_per_s_std / table.samples_per_s < 0.1).all(), table
    # measured on 2 cores: sync_ps and downpour add a server rank, so 3 ranks at 2 workers
    assert (runs.cores == 2).all()
    crowded = table[table.ranks_exceed_cores]
    assert sorted(zip(crowded.algorithm, crowded.num_workers, strict=True)) == [("downpour", 2),
                                                                              ("sync_ps", 2)]
    assert sorted(p.name for p in (REFERENCE / "figures").iterdir()) == [
        "breakdown.png", "efficiency.png", "scaling_model.png", "speedup.png", "throughput.png"]


def test_run_id_is_keyed_by_host_and_commit(monkeypatch):
    config = TrainConfig.from_dict({**TINY, "algorithm": "ddp"})
    here = run_id(config, 2, 0)
    assert run_id(config, 2, 1) != here
    monkeypatch.setattr(provenance, "git_sha", lambda: "another-commit")
    assert run_id(config, 2, 0) != here
    monkeypatch.undo()
    monkeypatch.setattr(provenance, "machine", lambda: {"host": "another-host", "cores": 1,
                                                        "cpu_model": ""})
    assert run_id(config, 2, 0) != here
    assert study_dir(root="results").parent.name == "another-host"


def test_figures_use_the_commit_measured_last(tmp_path):
    rows = pd.DataFrame({"run_id": list("abc"), "git_sha": ["old", "new", "new"],
                         "samples_per_s": [1.0, 2.0, 3.0]})
    rows.to_csv(tmp_path / "runs.csv", index=False)
    assert list(load_runs(tmp_path / "runs.csv").run_id) == ["b", "c"]


def test_a_csv_of_two_workloads_draws_one_and_names_the_other(tmp_path, capsys):
    """A study of your own model run into `make study`'s directory adds its rows to the same CSV;
    its figures joined both models' throughput into one line per algorithm."""
    runs = pd.read_csv(REFERENCE / "runs.csv", dtype={"run_id": str, "git_sha": str})
    mine = runs.assign(model="mymodels:build", samples_per_s=runs.samples_per_s * 10,
                       run_id=runs.run_id + "m")
    csv = tmp_path / "runs.csv"
    pd.concat([runs, mine]).to_csv(csv, index=False)
    reference = workload(SCALING_BASE)
    assert reference == {"model": "inception_small", "dataset": "synthetic-cifar", "batch_size": 32}
    assert len(load_runs(csv)) == 2 * len(runs)  # the CSV keeps both
    assert set(one_workload(load_runs(csv)).model) == {"mymodels:build"}  # the one measured last
    table = scaling_table(load_runs(csv, reference))
    pd.testing.assert_frame_equal(table, scaling_table(load_runs(REFERENCE / "runs.csv")))
    assert other_workloads(load_runs(csv), reference) == ["mymodels:build on synthetic-cifar, batch 32"]
    assert other_workloads(load_runs(REFERENCE / "runs.csv"), reference) == []
    figure = throughput_figure(one_workload(load_runs(csv), reference))
    drawn = {y for line in figure.axes[0].get_lines() for y in line.get_ydata()}
    assert drawn >= set(table.samples_per_s) and drawn.isdisjoint(set(table.samples_per_s * 10))
    assert [p.name for p in make_figures(csv, tmp_path / "figures", reference)][0] == "throughput.png"
    capsys.readouterr()
    assert main(["plot", str(tmp_path), "--study", "scaling"]) == 0  # no spec: the one measured last
    assert capsys.readouterr().out.endswith(
        f"{csv} also holds runs of inception_small on synthetic-cifar, batch 32; the figures are of "
        "the workload measured last, mymodels:build\n")


def test_scaling_table_against_ideal_linear_scaling():
    runs = pd.DataFrame({
        "algorithm": ["a", "a", "a", "b", "b"], "model": "m", "dataset": "d", "batch_size": 8,
        "num_workers": [1, 2, 2, 1, 4], "world_size": [1, 2, 2, 2, 5], "cores": 4, "hosts": "h",
        "samples_per_s": [100.0, 150.0, 170.0, 50.0, 100.0],
    })
    table = scaling_table(runs).set_index(["algorithm", "num_workers"])
    assert table.loc[("a", 2), "samples_per_s"] == 160.0  # mean of the repeats
    assert table.loc[("a", 2), "samples_per_s_std"] == pytest.approx(14.142, abs=1e-3)
    assert table.loc[("a", 2), "ideal_samples_per_s"] == 200.0
    assert table.loc[("a", 2), "efficiency"] == pytest.approx(0.8)
    assert table.loc[("b", 4), "efficiency"] == pytest.approx(0.5)
    assert table.loc[("b", 1), "efficiency"] == 1.0
    assert list(table.ranks_exceed_cores) == [False, False, False, True]  # b at 4 workers: 5 ranks


def test_emulated_points_are_their_own_series_never_mixed_with_real_ones():
    runs = pd.DataFrame({
        "algorithm": "a", "model": "m", "dataset": "d", "batch_size": 8, "cores": 2, "hosts": "h",
        "num_workers": [1, 2, 1, 2, 32], "world_size": [1, 2, 1, 2, 32],
        "compute": ["real", "real", "emulated", "emulated", "emulated"],
        "emulated_step_s": [None, None, 0.05, 0.05, 0.05],
        "samples_per_s": [100.0, 150.0, 20.0, 40.0, 320.0],
    })
    table = scaling_table(runs).set_index(["series", "num_workers"])
    emulated = "a (emulated, 50 ms a step)"
    assert set(table.index.get_level_values(0)) == {"a", emulated}
    assert table.loc[("a", 2), "efficiency"] == pytest.approx(0.75)  # against the real 1 worker
    assert table.loc[(emulated, 32), "efficiency"] == pytest.approx(0.5)  # the emulated one's
    assert table.loc[(emulated, 32), "compute"] == "emulated"
    assert set(scaling_table(runs.drop(columns=["compute", "emulated_step_s"]).iloc[:2]).series) \
        == {"a"}  # a CSV from before emulation: every row real


def test_bad_study_specs():
    with pytest.raises(ConfigError, match="algorithms='nope'"):
        StudySpec(algorithms=("nope",))
    with pytest.raises(ConfigError, match="algorithms='sync_ps:servers=2' .* for an emulated sweep"):
        StudySpec(algorithms=("sync_ps:servers=2",))  # was "choose from ...", sync_ps among them
    with pytest.raises(ConfigError, match="workers"):
        StudySpec(workers=(0,))
    with pytest.raises(ConfigError, match="repeats"):
        StudySpec(repeats=0)


def test_the_study_runs_downpour_without_warmstart_unless_told():
    def options(spec):
        return {config.algorithm: config.options for config, _, _ in spec.runs()}

    assert options(StudySpec(algorithms=("downpour", "ddp"), workers=(2,)))["downpour"].warmstart == 0
    told = StudySpec(algorithms=("downpour",), workers=(2,),
                     options={"downpour": {"warmstart": 5, "servers": 2}})
    assert options(told)["downpour"].warmstart == 5 and options(told)["downpour"].servers == 2
    kept = StudySpec(algorithms=("downpour",), workers=(2,), options={"downpour": {"servers": 2}})
    assert options(kept)["downpour"].warmstart == 0


def test_a_cluster_study_runs_smaller_worlds_after_larger_ones(study):
    """make study's shape on 2 cores: one cluster sized to the largest run (sync_ps with its server
    at 2 workers: 3 ranks) runs the 1- and 2-rank runs after it on the same engines, repeat after
    repeat."""
    _, spec, runs, log = study
    sizes = [2, 3, 1, 2]  # sync_ps at 1 and 2 workers, ddp at 1 and 2
    assert [size for _, size, _ in spec.runs()] == sizes * 2
    assert list(runs.world_size) == sizes * 2
    assert any(line.startswith("starting a local-mpi cluster of 3 engines for 8 run(s)") for line in log), log


def test_every_run_records_the_load_and_the_log_counts_the_runs(study):
    _, _, runs, log = study
    from downpour_lib.study.load import COLUMNS, MIN_WINDOW_S

    judged_only = {"load_others_cpu_s", "load_others_share"}  # NaN where the window is too short
    for column in set(COLUMNS) - judged_only:
        assert runs[column].notna().all(), column
    assert runs.under_load.isin([True, False]).all()
    assert (runs.load_window_s > 0).all() and (runs.load_avg_1m_end >= 0).all()
    # a run of 6 tiny steps on warm engines (0.2-0.4 s here) is under MIN_WINDOW_S, too short for
    # /proc/stat's ticks: not judged. An engine's first (it imports torch._dynamo) may be judged or
    # not; test_the_load_probe_counts_other_processes_and_not_the_runs_own judges a 1.5 s window.
    timed = runs.load_window_s >= MIN_WINDOW_S
    judged, short = runs[timed], runs[~timed]
    assert judged[list(COLUMNS)].notna().all().all()
    assert ((judged.load_others_share >= 0) & (judged.load_others_share <= 1.01)).all()
    assert (judged.under_load == (judged.load_others_share >= 0.10)).all()
    assert short.load_others_share.isna().all() and short.load_others_cpu_s.isna().all()
    assert not short.under_load.any()
    started = [line for line in log if line.startswith("run   ")]
    assert [line.split(":")[0] for line in started] == [f"run   {k} of 8" for k in range(1, 9)]
    assert any(line.startswith("done  8 of 8: ") for line in log), log


def _spin(seconds: float) -> str:
    return f"import time\nend = time.process_time() + {seconds}\nwhile time.process_time() < end: pass"


def test_the_load_probe_counts_other_processes_and_not_the_runs_own():
    """Reference: the CPU time of a process outside the run (an orphan, as another user's job is)
    must be in load_others_cpu_s, and that of the run's own child must not."""
    import subprocess
    import sys

    import psutil

    from downpour_lib.study.load import LoadProbe, machine_busy_s

    # a busy process that is not this one's descendant: its shell exits, leaving it to init
    other_pid = int(subprocess.run(
        ["sh", "-c", f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
        capture_output=True, text=True, check=True).stdout)
    other = psutil.Process(other_pid)
    try:
        assert os.getpid() not in [p.pid for p in other.parents()]
        time.sleep(0.5)
        busy0, other0 = machine_busy_s(), sum(other.cpu_times()[:2])
        with LoadProbe() as probe:
            child = subprocess.run([sys.executable, "-c", _spin(1.5)], check=True)
        other_s, busy_s = sum(other.cpu_times()[:2]) - other0, machine_busy_s() - busy0
    finally:
        other.kill()
        other.wait(10)
    assert child.returncode == 0
    load = probe.columns()
    assert load["load_others_cpu_s"] >= 0.9 * other_s - 0.1, (load, other_s)
    assert load["load_others_cpu_s"] <= busy_s - 0.9 * 1.5 + 0.1, (load, busy_s)  # not its own child
    assert load["under_load"] == (load["load_others_share"] >= 0.10)


def _loaded_runs(study_runs: pd.DataFrame) -> pd.DataFrame:
    """The study's rows, with sync_ps at 2 workers measured under load in one of its repeats."""
    runs = study_runs.copy()
    runs["under_load"] = False
    runs["load_others_share"] = 0.02
    hit = runs.index[(runs.algorithm == "sync_ps") & (runs.num_workers == 2)][:1]
    runs.loc[hit, ["under_load", "load_others_share", "load_avg_1m_end"]] = [True, 0.41, 6.2]
    return runs


def test_runs_under_load_are_marked_in_every_figure_and_said_at_the_end(study, tmp_path):
    from downpour_lib.study.scaling_plots import LOADED_MARK, breakdown_figure, report

    _, _, study_runs, _ = study
    runs = _loaded_runs(study_runs)
    table = scaling_table(runs)
    loaded = table[table.under_load]
    assert list(zip(loaded.algorithm, loaded.num_workers, loaded.loaded_runs, strict=True)) == \
        [("sync_ps", 2, 1)]
    ax = throughput_figure(runs).axes[0]
    handles, labels = ax.get_legend_handles_labels()
    marks = [h for h, label in zip(handles, labels, strict=True) if label.startswith(LOADED_MARK)]
    assert len(marks) == 1
    assert [tuple(p) for p in marks[0].get_offsets()] == [
        (dodged(table)[loaded.index[0]], loaded.samples_per_s.iloc[0])]
    assert "1 of 8 runs measured under load (other processes took up to 41% of the cores, " \
           "load average up to 6.2)" in ax.get_title()
    assert any(t.get_text() == "1/2" for t in ax.texts)
    bars = breakdown_figure(runs).axes[0]
    crowded = "*" if table[table.under_load].ranks_exceed_cores.iloc[0] else ""
    assert [t.get_text() for t in bars.get_xticklabels()].count(f"sync_ps\n2w{crowded}!") == 1
    text = report(runs, [tmp_path / "a.png"])
    assert text.startswith(f"figures (from 8 runs):\n  {tmp_path / 'a.png'}")
    assert "MEASURED UNDER LOAD: 1 of 8 runs" in text and "1 of 4 points" in text
    quiet = report(runs.assign(under_load=False), [])
    assert "no run was measured under load" in quiet


def test_the_breakdown_draws_the_spread_of_the_step_over_repeats(study):
    from downpour_lib.records import TIME_PARTS
    from downpour_lib.study.scaling_plots import breakdown_figure

    _, _, runs, _ = study
    ax = breakdown_figure(runs).axes[0]
    bars = [c for c in ax.containers if getattr(c, "has_yerr", False)]
    assert len(bars) == 1
    heights = [(seg[1][1] - seg[0][1]) / 2 for seg in bars[0].lines[2][0].get_segments()]
    step = runs.assign(total=runs[list(TIME_PARTS)].sum(axis=1))
    spread = step.groupby(["algorithm", "num_workers"]).total.std()
    assert heights == pytest.approx(list(spread.sort_index()), abs=1e-9)
    assert all(h > 0 for h in heights)
    assert "std of the step over repeats" in ax.get_title()


def _model_case():
    """Three algorithms measured at 1 and 2 workers whose compute per step grew 1.75x at 2 (ranks
    sharing the cores), and the model's curves: b and c coincide, a differs."""
    rows = []
    for name in ("a", "b", "c"):
        for workers, rate, compute in ((1, 100.0, 0.4), (2, 110.0, 0.7)):
            for r in range(2):
                rows.append({"algorithm": name, "model": "m", "dataset": "d", "batch_size": 8,
                             "num_workers": workers, "world_size": workers, "cores": 2,
                             "hosts": "box", "host": "box", "cpu_model": "cpu",
                             "torch_version": "2.x", "git_sha": "0123456789abcdef",
                             "measured_steps": 10, "samples_per_s": rate + r,
                             "data_s": 0.0, "compute_s": compute, "comm_s": 0.01, "wait_s": 0.0,
                             "update_s": 0.01})
    preds = []
    for name, drop in (("a", 0.002), ("b", 0.0), ("c", 0.0)):
        for workers in (1, 2, 4, 1024):
            preds.append({"algorithm": name, "model": "m", "workers": workers,
                          "efficiency": 1.0 - drop * (workers > 1) * workers ** 0.5,
                          "compute_s": 0.4, "comm_s": 0.01, "calibration": "measured-box"})
    return pd.DataFrame(rows), pd.DataFrame(preds)


def test_the_model_figure_names_its_machine_and_says_why_measurement_differs():
    from downpour_lib.study.scaling_model_plots import model_gaps, model_notes, scaling_model_figure

    runs, predictions = _model_case()
    gaps = model_gaps(runs, predictions)
    assert list(gaps.algorithm) == ["a", "b", "c"] and gaps.differs.all()
    assert gaps.efficiency.iloc[0] == pytest.approx(110.5 / 100.5 / 2)
    notes = model_notes(runs, predictions)
    assert len(notes) == 3
    assert notes[1].startswith("b at 2 workers: measured 0.55, predicted 1.00: compute per step "
                               "grew 1.75x over 1 worker (0.40 -> 0.70 s")
    fig = scaling_model_figure(runs, predictions)
    assert "measured on box" in fig._suptitle.get_text()
    assert "commit 0123456789" in fig._suptitle.get_text()
    near, far = fig.axes
    _, labels = far.get_legend_handles_labels()
    assert labels == ["a", "b, c"]  # coinciding curves drawn once
    caption = " ".join(t.get_text() for t in fig.texts)
    assert "3 of 3 measured points differ from the model" in caption
    assert "compute per step grew 1.75x over its 1-worker time" in caption
    # the measured points sit apart from each other at 2 workers, predicted beside each
    xs = [c.lines[0].get_xdata()[0] for c in near.containers if c.has_yerr]
    assert len(set(xs)) == 3
    agree = runs.assign(samples_per_s=runs.samples_per_s.where(runs.num_workers == 1,
                                                               runs.samples_per_s * 1.8))
    assert not model_gaps(agree, predictions).differs.any()
    assert model_notes(agree, predictions) == []
    assert not far.collections  # a measured calibration: points, no band
    banded = predictions.assign(efficiency_low=predictions.efficiency - 0.05,
                                efficiency_high=predictions.efficiency + 0.05)
    far = scaling_model_figure(runs, banded).axes[1]
    assert len(far.collections) == 2  # one band a drawn curve: "a", and "b, c" together
    band = far.collections[0].get_paths()[0].vertices[:, 1]
    assert band.min() == pytest.approx(0.95 - 0.002 * 1024 ** 0.5)


def test_the_study_says_which_algorithms_it_leaves_out_and_why():
    from downpour_lib.algorithms import ALGORITHMS
    from downpour_lib.study.scaling import DEFAULT_ALGORITHMS, LEFT_OUT, left_out

    assert set(DEFAULT_ALGORITHMS) | set(LEFT_OUT) == set(ALGORITHMS)
    assert not set(DEFAULT_ALGORITHMS) & set(LEFT_OUT)
    text = left_out(DEFAULT_ALGORITHMS)
    assert text.startswith(f"{len(DEFAULT_ALGORITHMS)} of the {len(ALGORITHMS)} algorithms are in "
                           "this study; left out:")  # the counts of the registries, whatever is added
    assert all(f"  {name}: {why}" in text for name, why in LEFT_OUT.items())
    assert left_out(tuple(ALGORITHMS)) == f"all {len(ALGORITHMS)} algorithms are in this study"


def test_the_model_beside_the_emulated_sweep_uses_its_own_compute_and_one_node():
    from downpour_lib.perf.calibration import Calibration, Workload
    from downpour_lib.perf.netmodel import Link, Network
    from downpour_lib.study.emulated_check import emulated_vs_model

    link = Link(1e-5, 1e9)  # 10 us, 1 GB/s inside the node; the inter link must not be used
    cal = Calibration("here", Network(link, Link(1.0, 1.0), per_node=2),
                      {"m": Workload("m", 8, compute_s=9.0, param_bytes=1e6)}, overlap=0.0)
    runs = pd.DataFrame({
        "algorithm": "allreduce", "model": "m", "dataset": "d", "batch_size": 8, "cores": 2,
        "num_workers": [1, 4, 1], "world_size": [1, 4, 1], "step_s": [0.05, 0.06, 0.5],
        "comm_s": 0.0, "wait_s": 0.0, "compute_s": 0.05, "update_s": 0.0,
        "compute": ["emulated", "emulated", "real"], "emulated_step_s": [0.05, 0.05, None],
        "samples_per_s": 1.0})
    table = emulated_vs_model(runs, cal).set_index("workers")
    assert list(table.index) == [1, 4]  # the real row is not in it
    assert table.loc[1, "error"] == 0.0  # the series' own 1-worker step is the compute
    ring = 2 * 3 * (1e-5 + 1e6 / 4 / 1e9)  # a ring on the intra link, all 4 on one node
    assert table.loc[4, "predicted_step_s"] == pytest.approx(0.05 + ring)
    assert table.loc[4, "error"] == pytest.approx((0.05 + ring) / 0.06 - 1)
