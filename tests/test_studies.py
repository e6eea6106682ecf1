"""Every study has one shape: this machine's results in results/<host>/<study>/, the committed references
in results/reference/<study>/ (one tidy runs.csv with provenance, its figures), and `downpour plot`
redraws any of them from the CSVs alone."""

import shutil

import pandas as pd
import pytest
from conftest import BIN, ROOT, explain, mpiexec, read_json

from downpour_lib import provenance
from downpour_lib.cli import main
from downpour_lib.config import TrainConfig
from downpour_lib.errors import ConfigError
from downpour_lib.study import accuracy_plots, gossip_plots, scaling_plots, staleness_plots
from downpour_lib.study.core import (
    REFERENCE_ROOT,
    STUDIES,
    Outcome,
    PlannedRun,
    StudyError,
    StudyStore,
    host_dirname,
    reference_dir,
    results_dir,
    run_plan,
)

FIGURES = {"scaling": scaling_plots.FIGURES, "staleness": staleness_plots.FIGURES,
           "gossip": gossip_plots.FIGURES, "accuracy": accuracy_plots.FIGURES,
           "lm": accuracy_plots.LOSS_FIGURES}


def figures(study: str, directory) -> list[str]:
    """The PNGs a study's directory gets: its figures, and the performance model's curves where
    the scaling study has the model's predictions.csv."""
    names = list(FIGURES[study])
    if study == "scaling" and (directory / "predictions.csv").is_file():
        names.append("scaling_model")
    return sorted(f"{name}.png" for name in names)


def test_each_study_has_its_directory_here_and_in_the_reference():
    host = host_dirname()
    assert host == provenance.machine()["host"].replace(" ", "_")
    for study in STUDIES:
        assert results_dir(study, root="results").parts == ("results", host, study)
        assert reference_dir(study) == ROOT.joinpath(REFERENCE_ROOT, study).relative_to(ROOT)
    assert results_dir("gossip", out="/tmp/x").as_posix() == "/tmp/x"
    with pytest.raises(ValueError, match="choose one of scaling, staleness, gossip"):
        results_dir("nope")


@pytest.mark.parametrize("study", STUDIES)
def test_the_committed_reference_is_one_tidy_csv_with_provenance_and_its_figures(study):
    where = ROOT / REFERENCE_ROOT / study
    runs = pd.read_csv(where / "runs.csv")
    for column in ("run_id", "git_sha", "host", "cores", "cpu_model", "torch_version", "launcher",
                   "algorithm", "model", "samples_per_s"):
        assert column in runs and runs[column].notna().all(), (study, column)
    # MPI's version where MPI started the ranks (srun's ranks on the sandbox run gloo without MPI)
    assert runs[runs.launcher == "mpi"].mpi_version.notna().all(), study
    assert runs[runs.launcher != "mpi"].mpi_version.isna().all(), study
    assert runs.run_id.is_unique and runs.git_sha.nunique() == 1 and runs.host.nunique() == 1
    assert sorted(p.name for p in (where / "figures").iterdir()) == figures(study, where)
    if study == "scaling":  # the model's curves, each row naming the calibration it came from
        predictions = pd.read_csv(where / "predictions.csv")
        assert set(predictions.algorithm) == set(runs.algorithm)
        assert predictions.workers.max() == 1024 and predictions.calibration_source.notna().all()


def test_downpour_plot_redraws_every_study_from_its_csvs_alone(tmp_path, monkeypatch, capsys):
    """Only the CSVs of each reference, in this machine's layout: `downpour plot` (no arguments)
    draws every study's figures beside them; a study directory given by path works the same."""
    here = results_dir("scaling", root=tmp_path / "results").parent
    for study in STUDIES:
        (here / study).mkdir(parents=True)
        for csv in (ROOT / REFERENCE_ROOT / study).glob("*.csv"):
            shutil.copy(csv, here / study)
    monkeypatch.chdir(tmp_path)
    assert main(["plot"]) == 0
    for study in STUDIES:
        assert sorted(p.name for p in (here / study / "figures").iterdir()) == \
            figures(study, here / study), study
    out = capsys.readouterr().out
    assert out.count("wrote ") == sum(len(figures(study, here / study)) for study in STUDIES)

    shutil.rmtree(here / "gossip" / "figures")
    assert main(["plot", str(here / "gossip"), "--figures", str(tmp_path / "elsewhere")]) == 0
    assert sorted(p.name for p in (tmp_path / "elsewhere").iterdir()) == sorted(
        f"{name}.png" for name in FIGURES["gossip"])
    assert not (here / "gossip" / "figures").exists()


def test_downpour_plot_says_what_is_missing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["plot"]) == 1
    assert capsys.readouterr().out.count("make studies") == len(STUDIES)
    (tmp_path / "mine").mkdir()
    assert main(["plot", str(tmp_path / "mine")]) == 2  # which study? the name does not say
    assert "give --study" in capsys.readouterr().err


def test_a_store_writes_companions_before_the_row_that_marks_a_run_done(tmp_path):
    """An interrupted add leaves companion rows without a run row: the run is not done, and adding
    it again replaces them instead of doubling them."""
    from downpour_lib.config import TrainConfig
    from downpour_lib.study.core import Outcome, PlannedRun

    store = StudyStore(tmp_path, ("evals",))
    run = PlannedRun(TrainConfig(algorithm="local", steps=5), 1, label="local")
    evals = pd.DataFrame({"step": [0, 1], "accuracy": [0.1, 0.2]})
    store.add(run, Outcome({"algorithm": "local"}, {"evals": evals}))
    store.path("runs").unlink()  # as if the run's row had never been written
    assert store.done() == set()
    store.add(run, Outcome({"algorithm": "local"}, {"evals": evals}))
    assert store.done() == {run.run_id}
    assert list(store.frame("evals").step) == [0, 1]
    frames = store.read()
    assert list(frames["runs"].columns[:3]) == ["run_id", "repeat", "algorithm"]
    assert set(frames["evals"].run_id) == {run.run_id}


def test_every_study_is_one_protocol_that_run_study_runs(tmp_path):
    """The studies are ``Study``s (plan, measure, tables, figures) named as their result
    directories; ``run_study`` plans first (bad input fails before anything is measured), then
    measures, draws from the CSVs when asked, and returns the tables."""
    from downpour_lib.study.gossip import GossipPlan
    from downpour_lib.study.scaling import study_spec
    from downpour_lib.study.studies import (
        STUDY_CLASSES,
        Accuracy,
        Gossip,
        Scaling,
        Staleness,
        Study,
        TimeToLoss,
        run_study,
    )

    assert tuple(STUDY_CLASSES) == STUDIES
    studies = [Scaling(study_spec(["ddp"], [1], csv=tmp_path / "runs.csv")), Staleness([], tmp_path),
               Gossip(GossipPlan({}, 1, ()), tmp_path), Accuracy([], tmp_path),
               TimeToLoss([], tmp_path)]
    assert [s.name for s in studies] == list(STUDIES)
    assert all(isinstance(s, Study) for s in studies)
    with pytest.raises(TypeError, match="run_study takes a Study"):
        run_study(object())

    calls = []

    class Recorded:
        name = "recorded"

        def plan(self):
            calls.append("plan")
            return []

        def measure(self, fresh=False, log=print):
            calls.append(f"measure fresh={fresh}")

        def tables(self):
            calls.append("tables")
            return "the tables"

        def figures(self):
            calls.append("figures")
            return [tmp_path / "a.png"]

    log = []
    assert run_study(Recorded(), fresh=True, figures=True, log=log.append) == "the tables"
    assert calls == ["plan", "measure fresh=True", "figures", "tables"]
    assert log == [f"wrote {tmp_path / 'a.png'}"]

    class Refused(Recorded):
        def plan(self):
            raise ConfigError("workers", 0, "give 1 or more")

    calls.clear()
    with pytest.raises(ConfigError, match="workers=0"):
        run_study(Refused())
    assert calls == []  # nothing measured

    class Uncallable(Recorded):  # a user's model that no run could build: said once, before any
        def plan(self):
            calls.append("plan")
            return [PlannedRun(TrainConfig(algorithm="local", model="nosuchmodule:build"), 1)] * 3

    calls.clear()
    with pytest.raises(ConfigError, match="module 'nosuchmodule' does not import"):
        run_study(Uncallable())
    assert calls == ["plan"]

    copy = tmp_path / "gossip"
    shutil.copytree(ROOT / REFERENCE_ROOT / "gossip", copy, ignore=shutil.ignore_patterns("*.png"))
    drawn = Gossip(GossipPlan({}, 1, ()), copy).figures()
    assert sorted(p.name for p in drawn) == sorted(f"{name}.png" for name in FIGURES["gossip"])


def test_a_study_says_each_error_once_with_the_runs_it_failed(tmp_path):
    """Runs that fail alike are one line of the closing error, which says whether any run was kept."""
    plan = [PlannedRun(TrainConfig(algorithm="local", steps=steps), 1, label=f"local   {steps} steps")
            for steps in (5, 6, 7)]

    def measure(run):
        if run.config.length.steps < 7:
            raise ConfigError("model", "mine", "a model that builds")
        return Outcome({"algorithm": "local"})

    log = []
    with pytest.raises(StudyError) as error:
        run_plan(plan, StudyStore(tmp_path), measure, log=log.append)
    assert str(error.value) == (f"2 of 3 run(s) failed; the others are in {StudyStore(tmp_path)}:\n"
                                "2 runs (local 5 steps, ...): model='mine' is not valid: a model that builds")
    assert [line.split(":")[0] for line in log] == ["FAIL  1 of 3", "FAIL  2 of 3", "done  3 of 3"]
    with pytest.raises(StudyError) as error:  # nothing kept: no pointer to a CSV
        run_plan(plan[:1], StudyStore(tmp_path / "none"), measure, log=log.append)
    assert str(error.value) == ("1 of 1 run(s) failed:\n"
                                "local 5 steps: model='mine' is not valid: a model that builds")


def test_run_ids_that_look_like_numbers_stay_text(tmp_path):
    """A run id is 12 hex digits; about 1 in 230 is digits and one "e" (a float to pandas, inf)
    and some are all digits (leading zeros lost): a resumed study must still find them."""
    ids = ["7499e7174429", "000123456789", "16a9ccff0302"]
    pd.DataFrame({"run_id": ids, "git_sha": ["0123456", "1e5", "abc"], "x": [1, 2, 3]}).to_csv(
        tmp_path / "runs.csv", index=False)
    store = StudyStore(tmp_path)
    assert store.done() == set(ids)
    assert list(store.read(ids)["runs"].run_id) == ids
    assert list(store.frame().git_sha) == ["0123456", "1e5", "abc"]


# -- several trainings in one launch (study/batch.py) --------------------------------------------

def test_a_batch_trains_each_run_as_a_launch_of_its_own_would(tmp_path):
    """Under mpiexec -n 2, a bench of the link, then localsgd, then allreduce in one session:
    allreduce's run ends where the same run under ``downpour train`` alone does (same loss, same
    bytes; what ran before leaves nothing behind that changes it), and each run's records are in
    its own directory."""
    from downpour_lib import TrainConfig
    from downpour_lib.study.batch import batch_command, read_batch

    base = {"model": "mlp", "dataset": "digits", "steps": 12, "batch_size": 16, "threads": 1,
            "backend": "gloo", "final_eval": False}
    configs = {name: TrainConfig.from_dict({**base, "algorithm": name})
               for name in ("localsgd", "allreduce")}
    link = tmp_path / "collectives.json"
    bench = ["--backends", "gloo", "--ops", "allreduce,broadcast", "--sizes", "4K,1M",
             "--min-time", "0", "--min-reps", "2", "--json", str(link)]
    proc = mpiexec(2, *batch_command(configs, tmp_path, bench))
    assert proc.returncode == 0, explain(proc)
    rows = [r for r in read_json(link) if r["backend"] == "gloo"]
    assert [(r["op"], r["bytes"]) for r in rows] == [
        (op, size) for op in ("allreduce", "broadcast") for size in (4096, 1 << 20)]
    assert all(r["world_size"] == 2 and r["p50_s"] > 0 for r in rows), rows
    runs = read_batch(tmp_path, configs)
    assert list(runs) == ["localsgd", "allreduce"]
    assert all((tmp_path / name / "steps.csv").is_file() for name in runs)
    alone = tmp_path / "alone.json"
    proc = mpiexec(2, str(BIN / "downpour"), "train", "--algorithm=allreduce",
                   *(f"--{k.replace('_', '-')}={v}" for k, v in base.items()), f"--summary-json={alone}")
    assert proc.returncode == 0, explain(proc)
    reference = read_json(alone)
    for key in ("final_train_loss", "bytes_sent_per_step", "total_steps", "world_size"):
        assert runs["allreduce"][key] == reference[key], key


def test_a_batch_shares_one_process_group_and_names_plain_directories(tmp_path):
    from downpour_lib import TrainConfig
    from downpour_lib.study.batch import batch_command

    gloo, mpi = (TrainConfig(algorithm="allreduce", backend=b) for b in ("gloo", "mpi"))
    with pytest.raises(ConfigError, match="one backend, device, timeout_s and startup_timeout_s"):
        batch_command({"a": gloo, "b": mpi}, tmp_path)
    with pytest.raises(ConfigError, match="name='../x'"):
        batch_command({"../x": gloo}, tmp_path)
    with pytest.raises(ConfigError, match="ops='nope' is not valid"):
        batch_command({"a": gloo}, tmp_path, ["--ops", "nope"])
    with pytest.raises(ConfigError, match="bench='--sizes' is not valid"):
        batch_command({"a": gloo}, tmp_path, ["--sizes"])
    assert not (tmp_path / "batch.json").exists() and not (tmp_path / "bench.json").exists()
    batch_command({"a": gloo}, tmp_path, ["--sizes", "4K"])
    assert (tmp_path / "bench.json").exists()
    batch_command({"a": gloo}, tmp_path)  # the directory again, without a bench: none runs
    assert not (tmp_path / "bench.json").exists()


def test_a_study_whose_runs_of_two_algorithms_are_refused_alike_stops(tmp_path):
    """One refusal of the runs' input, word for word, for two algorithms (a model that does not
    fit the data) is every run's: the study stops there, StudyRefused (exit 2), not after each
    run of the plan failed alike. Refusals of one algorithm alone go on (above)."""
    from downpour_lib.study.core import StudyRefused

    plan = [PlannedRun(TrainConfig(algorithm=algorithm), workers, label=f"{algorithm} {workers}")
            for algorithm in ("allreduce", "localsgd", "ddp") for workers in (1, 2)]
    measured = []

    def measure(run):
        measured.append(run.label)
        raise ConfigError("model", "mine:narrow", "on 2 samples it returns (2, 3)")

    log = []
    with pytest.raises(StudyRefused) as error:
        run_plan(plan, StudyStore(tmp_path), measure, log=log.append)
    assert measured == ["allreduce 1", "allreduce 2", "localsgd 1"]
    assert str(error.value) == ("3 runs of allreduce, localsgd were refused alike, and the other 3 "
                                f"would be: stopping. Fix it and run again (runs measured are kept "
                                f"in {StudyStore(tmp_path)}):\nmodel='mine:narrow' is not valid: on "
                                "2 samples it returns (2, 3)")


def test_a_refusal_is_found_in_a_launched_commands_output_in_either_form():
    """``errors.refusal``: the line of a ConfigError, "is not valid" or "is missing", among other
    output (prterun's box); a failure that refused no input has none."""
    from downpour_lib.errors import refusal

    box = "-----\nprterun detected that one or more processes exited with non-zero status\n-----"
    for error in (ConfigError("model", "mine", "a model that builds"),
                  ConfigError.missing("models.mine.batch", "samples per worker")):
        assert refusal(f"downpour train: error: {error}\n{box}") == f"downpour train: error: {error}"
    assert refusal(f"Traceback (most recent call last):\nRuntimeError: boom\n{box}") is None
