"""Notebook 04's library: the gossip study's configurations, its plan, its tidy frames and their CSVs
(resumable), figures and table, on synthetic run results (the runs themselves are exercised by
tests/test_notebooks.py)."""

import math
import shutil

import pandas as pd
import pytest
import torch

from downpour_lib.errors import ConfigError
from downpour_lib.models import build_model
from downpour_lib.records import RunResult
from downpour_lib.study.core import StudyStore
from downpour_lib.study.gossip import (
    NO_TOPOLOGY,
    TABLE_COLUMNS,
    TABLES,
    GossipRuns,
    GossipStudy,
    default_topology,
    plan_study,
    run_config,
    topologies_of,
)
from downpour_lib.study.gossip_plots import (
    accuracy_time_figure,
    algorithm_runs,
    bytes_figure,
    consensus_figure,
    consensus_runs,
    make_figures,
    parameter_bytes,
    size_runs,
    summary_table,
)

BASE = {"model": "mlp", "dataset": "digits", "steps": 20, "batch_size": 16, "lr": 0.05,
        "eval_every": 10, "threads": 1}
MODEL = 1000  # bytes of one model copy in the synthetic runs


def synthetic_result(config, world_size: int) -> RunResult:
    """What ``ClusterSession.train`` returns, with made-up numbers that depend on the run: gossip
    sends one model per out-peer (the complete graph n - 1), allreduce 2(n - 1)/n of it."""
    topology = getattr(config.options, "topology", None)
    peers = {"complete": world_size - 1, "ring": min(2, world_size - 1)}.get(topology, min(1, world_size - 1))
    sent = 2 * (world_size - 1) * MODEL // world_size if topology is None else peers * MODEL
    summary = {"algorithm": config.algorithm, "world_size": world_size, "model": config.model,
               "dataset": config.data.dataset, "batch_size": config.data.batch_size,
               "steps": config.length.steps,
               "samples_per_s": 100.0 * world_size, "test_accuracy": 0.9,
               "bytes_sent_per_step": float(sent), "bytes_received_per_step": float(sent)}
    evals = pd.DataFrame({"rank": 0, "step": [19, 9], "time_s": [2.0, 1.0], "loss": [0.5, 1.0],
                          "accuracy": [0.9, 0.5], "samples": 360})
    if topology is not None:
        distance = 0.0 if topology == "complete" or world_size == 1 else 0.1
        summary.update({"options.topology": topology, "final_consensus_distance": distance})
        evals["consensus_distance"] = [distance, 2 * distance]
    return RunResult(config.to_dict(), pd.DataFrame(), evals, summary)


class Recorder:
    """A ``train`` for GossipStudy that keeps the (algorithm, topology, world size) of every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, int]] = []

    def __call__(self, config, world_size: int) -> RunResult:
        self.calls.append((config.algorithm, getattr(config.options, "topology", NO_TOPOLOGY),
                           world_size))
        return synthetic_result(config, world_size)


def study(max_world_size: int = 4) -> tuple[GossipStudy, Recorder, list[str]]:
    recorder, log = Recorder(), []
    return GossipStudy(recorder, dict(BASE), max_world_size, log.append), recorder, log


def test_the_graphs_each_algorithm_accepts():
    assert topologies_of("sgp") == topologies_of("osgp") == ("exponential", "ring", "complete")
    assert topologies_of("dpsgd") == ("ring", "complete")
    assert topologies_of("adpsgd") == ("bipartite_exponential",)
    assert topologies_of("allreduce") == ()
    assert [default_topology(a) for a in ("sgp", "dpsgd", "adpsgd", "allreduce")] == [
        "exponential", "ring", "bipartite_exponential", NO_TOPOLOGY]
    with pytest.raises(ConfigError, match="algorithm='gossip'"):
        topologies_of("gossip")


def test_run_config_puts_the_graph_in_the_options_and_keeps_the_base():
    config = run_config(BASE, "sgp", "ring")
    assert config.options.topology == "ring" and config.algorithm == "sgp"
    assert (config.model, config.data.dataset, config.data.batch_size) == ("mlp", "digits", 16)
    assert config.length.steps == 20
    assert run_config(BASE, "osgp").options.topology == "exponential"
    assert not hasattr(run_config(BASE, "allreduce").options, "topology")
    with pytest.raises(ConfigError, match="topology='exponential'.*dpsgd gossips over ring, complete"):
        run_config(BASE, "dpsgd", "exponential")
    with pytest.raises(ConfigError, match="topology='ring'.*allreduce gossips over no graph"):
        run_config(BASE, "allreduce", "ring")
    with pytest.raises(ConfigError, match="steps=0"):
        run_config({**BASE, "steps": 0}, "sgp")


def test_runs_are_tidy_frames_tagged_with_algorithm_graph_and_world_size():
    runs = GossipRuns.from_results([synthetic_result(run_config(BASE, "sgp", "ring"), 4),
                                    synthetic_result(run_config(BASE, "allreduce"), 4)])
    assert list(runs.summary[["algorithm", "topology", "world_size"]].itertuples(index=False, name=None)) \
        == [("sgp", "ring", 4), ("allreduce", NO_TOPOLOGY, 4)]
    assert set(TABLE_COLUMNS) <= set(runs.summary.columns)
    assert math.isnan(runs.summary.set_index("algorithm").loc["allreduce", "final_consensus_distance"])
    evals = runs.evals
    assert list(evals.columns[:8]) == ["algorithm", "topology", "world_size", "step", "time_s", "loss",
                                       "accuracy", "consensus_distance"]
    assert list(zip(evals.algorithm, evals.step, strict=True)) == [
        ("allreduce", 9), ("allreduce", 19), ("sgp", 9), ("sgp", 19)]  # sorted by run, then step
    assert evals[evals.algorithm == "allreduce"].consensus_distance.isna().all()
    assert list(evals[evals.algorithm == "sgp"].consensus_distance) == [0.2, 0.1]
    empty = GossipRuns.from_results([])
    assert empty.summary.empty and empty.evals.empty and set(TABLE_COLUMNS) <= set(empty.summary)


def test_the_study_runs_each_configuration_once_after_one_warm_up():
    s, recorder, log = study()
    by_topology = s.topologies(["exponential", "ring", "complete"])
    assert recorder.calls == [("sgp", "complete", 4),  # the unrecorded warm-up
                              ("sgp", "exponential", 4), ("sgp", "ring", 4), ("sgp", "complete", 4)]
    assert list(by_topology.summary.topology) == ["exponential", "ring", "complete"]
    recorder.calls.clear()
    by_algorithm = s.algorithms(["sgp", "dpsgd", "allreduce"])
    assert recorder.calls == [("dpsgd", "ring", 4), ("allreduce", NO_TOPOLOGY, 4)]  # sgp is reused
    assert list(by_algorithm.summary.algorithm) == ["sgp", "dpsgd", "allreduce"]
    assert len(log) == 5 and "dpsgd (ring) on 4 rank(s): test accuracy 0.900" in log[3]
    assert len(s.everything().summary) == 5


def test_the_warm_up_takes_the_base_but_trains_a_few_steps_and_writes_nothing(tmp_path):
    recorder = Recorder()
    configs = []
    base = {**BASE, "steps": None, "epochs": 2.0, "output_dir": str(tmp_path)}

    def train(config, world_size):
        configs.append(config)
        return recorder(config, world_size)

    GossipStudy(train, base, 2, log=[].append).algorithms(["allreduce"])
    warm, run = configs
    assert (warm.length.steps, warm.length.epochs, warm.model) == (5, None, "mlp")
    assert warm.outputs.output_dir is None
    assert (run.length.steps, run.length.epochs, run.outputs.output_dir) == (None, 2.0, str(tmp_path))
    configs.clear()
    GossipStudy(train, base, 2, log=[].append, warm_up=False).algorithms(["allreduce"])
    assert len(configs) == 1


def test_world_sizes_skip_what_an_algorithm_cannot_run_and_say_why():
    s, recorder, log = study()
    runs = s.world_sizes(["adpsgd", "sgp"], [2, 3, 4])
    assert sorted(zip(runs.summary.algorithm, runs.summary.world_size, strict=True)) == [
        ("adpsgd", 2), ("adpsgd", 4), ("sgp", 2), ("sgp", 3), ("sgp", 4)]
    assert len(runs.skipped) == 1 and runs.skipped[0].startswith("adpsgd on 3 rank(s)")
    assert "even number of ranks" in runs.skipped[0] and log[-1] == "skipped " + runs.skipped[0]


def test_bad_requests_fail_before_any_run():
    s, recorder, _ = study(max_world_size=2)
    with pytest.raises(ConfigError, match="world_size=4.*2 engines"):
        s.world_sizes(["sgp"], [2, 4])
    with pytest.raises(ConfigError, match="topology='star'"):
        s.topologies(["exponential", "star"])
    with pytest.raises(ConfigError, match="algorithm='gossip'"):
        s.algorithms(["sgp", "gossip"])
    assert recorder.calls == []
    s, recorder, _ = study(max_world_size=3)
    with pytest.raises(ConfigError, match=r"world_size=3 is not valid: adpsgd's graph, "
                                          r"topology='bipartite_exponential' \(its default.*even"):
        s.algorithms(["sgp", "adpsgd"])  # not skipped when asked for directly
    assert recorder.calls == []


def lines(ax) -> dict[str, tuple[list, list]]:
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.lines}


def test_the_consensus_figure_has_a_curve_per_graph():
    s, _, _ = study()
    fig = consensus_figure(s.topologies(["exponential", "ring"]))
    dist_ax, acc_ax = fig.axes
    curves = lines(dist_ax)
    assert curves == {"sgp (exponential), 4 ranks": ([9, 19], [0.2, 0.1]),
                      "sgp (ring), 4 ranks": ([9, 19], [0.2, 0.1])}
    assert dist_ax.get_yscale() == "log" and len(acc_ax.lines) == 2
    # the complete graph's distance can be exactly 0: then the scale stays linear
    assert consensus_figure(s.topologies(["complete"])).axes[0].get_yscale() == "linear"


def test_the_accuracy_figure_plots_against_time_and_steps():
    s, _, _ = study()
    time_ax, step_ax = accuracy_time_figure(s.algorithms(["sgp", "allreduce"])).axes
    assert lines(time_ax)["allreduce, 4 ranks"] == ([1.0, 2.0], [0.5, 0.9])
    assert lines(step_ax)["sgp (exponential), 4 ranks"] == ([9, 19], [0.5, 0.9])


def test_the_bytes_figure_has_a_line_per_method_and_the_computed_model_size():
    s, _, _ = study()
    ax, = bytes_figure(s.world_sizes(["sgp", "allreduce"], [4, 2, 3]), model_bytes=MODEL).axes
    curves = lines(ax)
    assert curves["sgp (exponential)"] == ([2, 3, 4], [1.0, 1.0, 1.0])  # kB, sorted by world size
    assert curves["allreduce"] == ([2, 3, 4], [1.0, 1.333, 1.5])
    assert curves["one copy of the model (computed)"][1] == [1.0, 1.0]
    assert len(bytes_figure(s.world_sizes(["sgp"], [2])).axes[0].lines) == 1  # no reference line


def test_the_summary_table_and_the_csvs(tmp_path):
    s, _, _ = study()
    s.world_sizes(["allreduce", "sgp"], [4, 2])
    s.topologies(["ring"])
    table = summary_table(s.everything())
    assert list(table.columns) == TABLE_COLUMNS
    assert list(zip(table.algorithm, table.topology, table.world_size, strict=True)) == [
        ("allreduce", NO_TOPOLOGY, 2), ("sgp", "exponential", 2),
        ("allreduce", NO_TOPOLOGY, 4), ("sgp", "exponential", 4), ("sgp", "ring", 4)]
    paths = s.everything().save(tmp_path / "out")
    assert [p.name for p in paths] == ["runs.csv", "evals.csv"]
    assert len(pd.read_csv(paths[0])) == 5 and len(pd.read_csv(paths[1])) == 10
    assert s.everything().save(None) == []


def test_parameter_bytes_counts_one_copy_of_the_model():
    model = build_model("mlp", (1, 8, 8), 10)
    assert parameter_bytes("mlp", "digits") == sum(p.numel() * 4 for p in model.parameters())
    assert all(p.dtype == torch.float32 for p in model.parameters())


PLAN = {"engines": 4, "algorithms": ["sgp", "dpsgd", "adpsgd", "allreduce"],
        "topologies": ["exponential", "ring"], "world_sizes": [2, 3, 4]}


def test_the_plan_asks_three_questions_and_plans_a_shared_run_once():
    plan = plan_study(BASE, **PLAN)
    table = plan.table()
    keys = list(zip(table.algorithm, table.topology, table.world_size, strict=True))
    assert keys[:2] == [("sgp", "exponential", 4), ("sgp", "ring", 4)]  # the consensus question
    assert len(keys) == len(set(keys)) and table.run_id.is_unique
    assert set(keys) == {("sgp", "exponential", 4), ("sgp", "ring", 4)} | {
        (a, default_topology(a), n) for a in PLAN["algorithms"] for n in (2, 3, 4)
        if not (a == "adpsgd" and n == 3)}
    assert len(plan.skipped) == 1 and plan.skipped[0].startswith("adpsgd on 3 rank(s)")
    with pytest.raises(ConfigError, match="world_size=3.*2 engines"):
        plan_study(BASE, **{**PLAN, "engines": 2})


def test_a_study_in_a_directory_resumes_the_runs_already_there(tmp_path):
    plan = plan_study(BASE, **PLAN)
    recorder = Recorder()
    first = GossipStudy(recorder, dict(BASE), 4, [].append,
                        store=StudyStore(tmp_path, TABLES)).run(plan)
    assert recorder.calls[0] == ("sgp", "complete", 4)  # the warm-up, then every planned run once
    assert len(recorder.calls) == 1 + len(plan.planned) and len(first.summary) == len(plan.planned)
    csvs = {p.name: p.read_bytes() for p in tmp_path.glob("*.csv")}
    assert sorted(csvs) == ["evals.csv", "runs.csv"]

    again, log = Recorder(), []  # a new kernel, the same directory: nothing runs, not even a warm-up
    resumed = GossipStudy(again, dict(BASE), 4, log.append, store=StudyStore(tmp_path, TABLES)).run(plan)
    assert again.calls == [] and {p.name: p.read_bytes() for p in tmp_path.glob("*.csv")} == csvs
    assert sum(line.startswith("skip ") for line in log) == len(plan.planned)
    pd.testing.assert_frame_equal(resumed.summary, first.summary)

    more = plan_study(BASE, **{**PLAN, "algorithms": [*PLAN["algorithms"], "osgp"]})
    GossipStudy(again, dict(BASE), 4, [].append, store=StudyStore(tmp_path, TABLES)).run(more)
    assert again.calls == [("sgp", "complete", 4)] + [("osgp", "exponential", n) for n in (4, 2, 3)]
    runs = pd.read_csv(tmp_path / "runs.csv")
    assert len(runs) == len(more.planned) and runs.run_id.is_unique
    assert set(pd.read_csv(tmp_path / "evals.csv").run_id) == set(runs.run_id)


def test_the_figures_are_made_from_the_csvs_alone(tmp_path):
    GossipStudy(Recorder(), dict(BASE), 4, [].append,
                store=StudyStore(tmp_path / "measured", TABLES)).run(plan_study(BASE, **PLAN))
    (tmp_path / "copy").mkdir()
    for csv in (tmp_path / "measured").glob("*.csv"):
        shutil.copy(csv, tmp_path / "copy")
    runs = GossipRuns.load(tmp_path / "copy")
    assert set(lines(consensus_figure(consensus_runs(runs)).axes[0])) == {
        "sgp (exponential), 4 ranks", "sgp (ring), 4 ranks"}
    assert set(lines(accuracy_time_figure(algorithm_runs(runs)).axes[0])) == {
        "sgp (exponential), 4 ranks", "dpsgd (ring), 4 ranks",
        "adpsgd (bipartite_exponential), 4 ranks", "allreduce, 4 ranks"}
    bytes_lines = lines(bytes_figure(size_runs(runs)).axes[0])
    assert bytes_lines["allreduce"] == ([2, 3, 4], [1.0, 1.333, 1.5])
    assert bytes_lines["adpsgd (bipartite_exponential)"][0] == [2, 4]
    figures = make_figures(tmp_path / "copy")
    assert [f.relative_to(tmp_path / "copy").as_posix() for f in figures] == [
        "figures/consensus.png", "figures/accuracy_vs_time.png", "figures/bytes_per_step.png"]
    assert all(f.read_bytes()[:4] == b"\x89PNG" for f in figures)
