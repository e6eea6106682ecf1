"""The scaling study: real mpiexec runs into one tidy CSV, resumable, and figures from the CSV."""

import pandas as pd
import pytest

from downpour_lib.errors import ConfigError
from downpour_lib.study.plots import make_figures, scaling_table
from downpour_lib.study.sweep import StudySpec, run_study

TINY = {"model": "mlp", "dataset": "synthetic-mnist", "batch_size": 16, "steps": 6,
        "warmup_steps": 2, "eval_every": 0, "threads": 1}


def test_sweep_writes_one_row_per_run_and_resumes(tmp_path):
    csv = tmp_path / "runs.csv"
    spec = StudySpec(algorithms=("sync_ps", "ddp"), workers=(1, 2), base=TINY, csv=str(csv))
    log: list[str] = []
    runs = run_study(spec, log=log.append)
    assert len(runs) == 4 and runs.run_id.is_unique
    by = runs.set_index(["algorithm", "num_workers"])
    assert by.loc[("sync_ps", 2), "world_size"] == 3 and by.loc[("ddp", 2), "world_size"] == 2
    for column in ("samples_per_s", "comm_s", "git_sha", "torch_version", "mpi_version", "hosts",
                   "batch_size", "options.server"):
        assert column in runs.columns
    assert (runs.samples_per_s > 0).all()

    before = csv.read_text()
    log.clear()
    run_study(spec, log=log.append)  # everything is there already: nothing runs
    assert csv.read_text() == before and all(line.startswith("skip") for line in log)

    figures = make_figures(csv, tmp_path / "figures")
    assert [f.name for f in figures] == ["throughput.png", "speedup.png", "efficiency.png",
                                         "breakdown.png"]
    assert all(f.read_bytes()[:4] == b"\x89PNG" for f in figures)


def test_scaling_table_against_ideal_linear_scaling():
    runs = pd.DataFrame({
        "algorithm": ["a", "a", "a", "b", "b"], "model": "m", "dataset": "d", "batch_size": 8,
        "num_workers": [1, 2, 2, 1, 4], "world_size": [1, 2, 2, 2, 5],
        "samples_per_s": [100.0, 150.0, 170.0, 50.0, 100.0],
    })
    table = scaling_table(runs).set_index(["algorithm", "num_workers"])
    assert table.loc[("a", 2), "samples_per_s"] == 160.0  # median of the repeats
    assert table.loc[("a", 2), "ideal_samples_per_s"] == 200.0
    assert table.loc[("a", 2), "efficiency"] == pytest.approx(0.8)
    assert table.loc[("b", 4), "efficiency"] == pytest.approx(0.5)
    assert table.loc[("b", 1), "efficiency"] == 1.0


def test_bad_study_specs():
    with pytest.raises(ConfigError, match="algorithms='nope'"):
        StudySpec(algorithms=("nope",))
    with pytest.raises(ConfigError, match="workers"):
        StudySpec(workers=(0,))
