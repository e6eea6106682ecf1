"""Notebook 03's library: the plan of sync_ps and downpour runs, the tidy study, its CSVs and figures."""

import dataclasses
import math
import shutil

import pandas as pd
import pytest

from downpour_lib import provenance
from downpour_lib.engine import train
from downpour_lib.errors import ConfigError
from downpour_lib.records import RunResult
from downpour_lib.study import staleness_plots
from downpour_lib.study.core import StudyStore
from downpour_lib.study.staleness import (
    TABLE_COLUMNS,
    TABLES,
    StalenessStudy,
    cluster_size,
    plan_table,
    plan_variants,
    run_variants,
    time_to_accuracy,
    variant_label,
)

BASE = {"model": "mlp", "dataset": "digits", "batch_size": 16, "steps": 12, "eval_every": 4,
        "warmup_steps": 2, "threads": 1}
COLOCATED = {"server": "colocated"}


def test_every_run_has_the_same_workers_and_the_ranks_its_servers_need():
    plan = plan_variants(BASE, [{"servers": 1}, {"servers": 2, "n_fetch": 4, "n_push": 4},
                                {"servers": 2, **COLOCATED, "label": "two colocated"}],
                         workers=2, sync_ps={})
    table = plan_table(plan).set_index("label")
    assert list(table.index) == ["sync_ps", "downpour S=1 fetch=1 push=1",
                                 "downpour S=2 fetch=4 push=4", "two colocated"]
    assert (table.workers == 2).all()
    # dedicated servers take ranks of their own; colocated ones are workers too
    assert list(table.world_size) == [3, 3, 4, 2]
    assert list(table.placement) == ["dedicated", "dedicated", "dedicated", "colocated"]
    assert list(table.servers) == [1, 1, 2, 2]
    assert plan[2].config.options.n_push == 4 and plan[2].config.optim.optimizer == "adagrad"
    assert plan[0].config.optim.optimizer == "sgd"  # each algorithm's own default unless given
    assert cluster_size(plan) == 4 and cluster_size(plan, 6) == 6
    with pytest.raises(ConfigError, match=r"engines=3 .*'downpour S=2 fetch=4 push=4' runs on 4 ranks"):
        cluster_size(plan, 3)
    assert [v.algorithm for v in plan_variants(BASE, [{}], sync_ps=None)] == ["downpour"]


@pytest.mark.parametrize("base, variants, workers, match", [
    ({**BASE, "algorithm": "ddp"}, [{}], 2, "algorithm='ddp'"),
    (BASE, [], 2, "variants"),
    (BASE, [{"n_psh": 2}], 2, r"variants\[0\].*unknown key\(s\) n_psh"),
    (BASE, [{"n_push": 0}], 2, "n_push=0"),
    (BASE, [{"servers": 3, **COLOCATED}], 2, "servers=3"),
    (BASE, [{"n_fetch": 2}, {"n_fetch": 2}], 2, "same label"),
    (BASE, [{}], 0, "workers=0"),
    ({**BASE, "model": "nope"}, [{}], 2, "model='nope'"),
])
def test_a_bad_plan_fails_before_anything_runs(base, variants, workers, match):
    with pytest.raises(ConfigError, match=match):
        plan_variants(base, variants, workers=workers, sync_ps={})


def result(algorithm: str, rate: float, accuracies: list[float], hist: dict[str, int] | None) -> RunResult:
    """A RunResult-like record of a finished run: evaluations every second, a summary."""
    evals = pd.DataFrame({"rank": 0, "step": [10 * (i + 1) for i in range(len(accuracies))],
                          "time_s": [1.0 * (i + 1) for i in range(len(accuracies))],
                          "loss": [2.0 - a for a in accuracies], "accuracy": accuracies,
                          "samples": 100})
    summary = {"samples_per_s": rate, "wall_s": float(len(accuracies)), "total_steps": 12,
               "test_accuracy": accuracies[-1], "git_sha": "abc", "backend": "mpi"}
    if hist is not None:
        values = [int(k) for k, n in hist.items() for _ in range(n)]
        summary.update(staleness_mean=sum(values) / len(values), staleness_max=max(values),
                       staleness_hist=hist)
    return RunResult({}, pd.DataFrame(), evals, summary)


@pytest.fixture
def study():
    plan = plan_variants(BASE, [{"n_fetch": 1}, {"servers": 2, "n_fetch": 4, "n_push": 4}],
                         workers=2, sync_ps={})
    runs = [result("sync_ps", 1000.0, [0.5, 0.8, 0.95], None),
            result("downpour", 1500.0, [0.6, 0.91, 0.93], {"0": 6, "1": 3, "2": 1}),
            result("downpour", 2500.0, [0.3, 0.7, 0.85], {"3": 2, "1": 2})]
    return StalenessStudy.from_results(list(zip(plan, runs, strict=True)), target_accuracy=0.9)


def test_the_tidy_study_from_results(study):
    table = study.table()
    assert list(table.columns) == list(TABLE_COLUMNS)
    assert list(table.label) == ["sync_ps", "downpour S=1 fetch=1 push=1", "downpour S=2 fetch=4 push=4"]
    assert list(table.world_size) == [3, 3, 4] and list(table.n_push) == [1, 1, 4]
    assert list(table.samples_per_s) == [1000.0, 1500.0, 2500.0]
    assert list(table.test_accuracy) == [0.95, 0.93, 0.85]
    assert table.time_to_target_s.iloc[0] == 3.0 and table.time_to_target_s.iloc[1] == 2.0
    assert math.isnan(table.time_to_target_s.iloc[2])  # never reached 0.9
    assert math.isnan(table.staleness_mean.iloc[0]) and table.staleness_mean.iloc[1] == 0.5
    assert list(table.staleness_max.iloc[1:]) == [2.0, 3.0]
    assert study.runs.git_sha.iloc[0] == "abc" and study.runs.model.iloc[0] == "mlp"
    hist = study.staleness
    last = hist[hist.label == "downpour S=2 fetch=4 push=4"]
    assert list(last.staleness) == [1, 3] and list(last.fraction) == [0.5, 0.5]  # sorted by staleness
    assert hist.groupby("label").fraction.sum().tolist() == pytest.approx([1.0, 1.0])
    assert "sync_ps" not in set(hist.label)
    assert len(study.evals) == 9 and list(study.evals.columns) == [
        "label", "algorithm", "step", "time_s", "loss", "accuracy"]
    assert set(study.results) == set(table.label)


def test_csvs_round_trip_and_the_figures_come_from_them(study, tmp_path):
    paths = study.save(tmp_path / "staleness")
    assert sorted(p.name for p in paths) == ["evals.csv", "runs.csv", "staleness.csv"]
    loaded = StalenessStudy.load(tmp_path / "staleness")
    pd.testing.assert_frame_equal(loaded.table(), study.table(), check_dtype=False)
    pd.testing.assert_frame_equal(loaded.staleness, study.staleness, check_dtype=False)
    assert loaded.target_accuracy == 0.9 and loaded.results == {}

    figures = staleness_plots.make_figures(tmp_path / "staleness", tmp_path / "figures")
    assert [f.name for f in figures] == ["accuracy_vs_time.png", "throughput.png", "staleness.png"]
    assert all(f.read_bytes()[:4] == b"\x89PNG" for f in figures)
    with pytest.raises(ConfigError, match="no runs.csv, evals.csv, staleness.csv"):
        StalenessStudy.load(tmp_path / "figures")


def test_the_figures_show_every_run(study):
    colors = staleness_plots.run_colors(study)
    assert colors == {"sync_ps": "black", "downpour S=1 fetch=1 push=1": "C0",
                      "downpour S=2 fetch=4 push=4": "C1"}
    acc_ax, loss_ax = staleness_plots.accuracy_vs_time_figure(study).axes
    assert [line.get_label() for line in acc_ax.get_lines()][:3] == study.labels
    assert len(loss_ax.get_lines()) == 3
    (bars,) = staleness_plots.throughput_figure(study).axes
    assert sorted(p.get_width() for p in bars.patches) == [1000.0, 1500.0, 2500.0]
    panels = [ax for ax in staleness_plots.staleness_figure(study).axes if ax.axison]
    assert [ax.get_title() for ax in panels] == study.labels[1:]  # one per downpour run
    assert [len(ax.patches) for ax in panels] == [3, 2]


def test_time_to_accuracy():
    evals = pd.DataFrame({"time_s": [1.0, 2.0, 3.0], "accuracy": [0.5, 0.92, 0.89]})
    assert time_to_accuracy(evals, 0.9) == 2.0 and math.isnan(time_to_accuracy(evals, 0.95))


class InProcess:
    """Runs a plan's 1-rank runs in this process, as a one-engine cluster would."""

    size = 1

    def train(self, config, world_size, timeout_s=None):
        assert world_size == 1
        return train(config)


def test_run_variants_for_real_on_one_rank():
    """One worker with a colocated server: pushing every step but fetching every 4th, its pushes
    are computed from parameters 0, 1, 2, 3 updates old, in turn (the reference for staleness)."""
    plan = plan_variants(BASE, [{"n_fetch": 4, "n_push": 1, **COLOCATED},
                                {"n_fetch": 2, "n_push": 2, **COLOCATED}], workers=1, sync_ps=COLOCATED)
    log: list[str] = []
    study = run_variants(InProcess(), plan, log=log.append)
    table = study.table().set_index("label")
    assert list(table.world_size) == [1, 1, 1] and (table.samples_per_s > 0).all()
    assert ((table.test_accuracy > 0.1) & (table.test_accuracy <= 1)).all()
    hist = study.staleness
    every_fourth = hist[hist.label == "downpour S=1 fetch=4 push=1 colocated"]
    assert list(every_fourth.staleness) == [0, 1, 2, 3] and list(every_fourth.updates) == [3, 3, 3, 3]
    assert table.loc["downpour S=1 fetch=4 push=1 colocated", "staleness_mean"] == 1.5
    assert table.loc["downpour S=1 fetch=2 push=2 colocated", "staleness_max"] == 0  # fetch after push
    assert len(study.evals) == 9  # steps 4, 8 and 12 of each run
    assert sum(line.startswith("done") for line in log) == 3

    with pytest.raises(ConfigError, match="engines=1"):
        run_variants(InProcess(), plan_variants(BASE, [{}], workers=1, sync_ps=None))  # dedicated: 2


class Counting(InProcess):
    """InProcess that counts what it trains."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def train(self, config, world_size, timeout_s=None):
        self.calls.append(variant_label(config.algorithm, dataclasses.asdict(config.options)))
        return super().train(config, world_size, timeout_s)


FETCH4 = {"n_fetch": 4, "n_push": 1, **COLOCATED}


def test_a_study_in_a_directory_resumes_the_runs_already_there(tmp_path):
    plan = plan_variants(BASE, [FETCH4], workers=1, sync_ps=COLOCATED)
    store = StudyStore(tmp_path, TABLES)
    cluster = Counting()
    first = run_variants(cluster, plan, store=store, log=[].append)
    assert len(cluster.calls) == 2
    csvs = {p.name: p.read_bytes() for p in tmp_path.glob("*.csv")}
    assert sorted(csvs) == ["evals.csv", "runs.csv", "staleness.csv"]

    log: list[str] = []
    again = run_variants(cluster, plan, store=StudyStore(tmp_path, TABLES), log=log.append)
    assert len(cluster.calls) == 2  # nothing ran again
    assert len(log) == 2 and all(line.startswith("skip") for line in log)
    assert {p.name: p.read_bytes() for p in tmp_path.glob("*.csv")} == csvs
    pd.testing.assert_frame_equal(again.table(), first.table())

    # one more variant: only that one runs
    bigger = plan_variants(BASE, [FETCH4, {"n_fetch": 2, "n_push": 2, **COLOCATED}], workers=1,
                           sync_ps=COLOCATED)
    run_variants(cluster, bigger, store=store, log=[].append)
    assert cluster.calls[2:] == ["downpour S=1 fetch=2 push=2 colocated"]
    runs = pd.read_csv(tmp_path / "runs.csv")
    assert len(runs) == 3 and runs.run_id.is_unique
    # one row per run, with every config field, its metrics and where it came from
    for column in ("run_id", "label", "model", "lr", "options.n_fetch", "samples_per_s", "git_sha",
                   "torch_version", "host", "cores", "cpu_model", "timestamp"):
        assert column in runs, column
    # the companion tables are keyed by the run's id
    evals, hist = pd.read_csv(tmp_path / "evals.csv"), pd.read_csv(tmp_path / "staleness.csv")
    assert set(evals.run_id) == set(runs.run_id)
    assert set(hist.run_id) == set(runs[runs.algorithm == "downpour"].run_id)


def test_a_new_commit_measures_again_and_the_figures_show_the_last(tmp_path, monkeypatch):
    plan = plan_variants(BASE, [FETCH4], workers=1, sync_ps=None)
    cluster = Counting()
    run_variants(cluster, plan, store=StudyStore(tmp_path, TABLES), log=[].append)
    monkeypatch.setattr(provenance, "git_sha", lambda: "a-newer-commit")
    run_variants(cluster, plan, store=StudyStore(tmp_path, TABLES), log=[].append)
    assert len(cluster.calls) == 2 and len(pd.read_csv(tmp_path / "runs.csv")) == 2
    loaded = StalenessStudy.load(tmp_path)
    assert list(loaded.runs.git_sha) == ["a-newer-commit"]
    assert set(loaded.evals.run_id) == set(loaded.runs.run_id)


def test_the_figures_are_made_from_the_csvs_alone(tmp_path):
    """Only the CSVs travel (a study measured elsewhere): the figures and the table come back."""
    plan = plan_variants(BASE, [FETCH4], workers=1, sync_ps=COLOCATED)
    measured = run_variants(InProcess(), plan, store=StudyStore(tmp_path / "measured", TABLES),
                            log=[].append)
    (tmp_path / "copy").mkdir()
    for csv in (tmp_path / "measured").glob("*.csv"):
        shutil.copy(csv, tmp_path / "copy")
    loaded = StalenessStudy.load(tmp_path / "copy")
    assert loaded.results == {} and loaded.labels == [v.label for v in plan]
    pd.testing.assert_frame_equal(loaded.table(), measured.table())
    figures = staleness_plots.make_figures(tmp_path / "copy")
    assert [f.relative_to(tmp_path / "copy").as_posix() for f in figures] == [
        "figures/accuracy_vs_time.png", "figures/throughput.png", "figures/staleness.png"]
    assert all(f.read_bytes()[:4] == b"\x89PNG" for f in figures)
