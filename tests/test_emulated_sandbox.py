"""Notebook 02's emulated sweep on the multi-node Slurm sandbox (study/emulated_sandbox.py): one
series per link rate, each row saying where it ran, and the model given the sandbox's links."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from conftest import BIN
from slurm_sandbox import running_sandbox

from downpour_lib.errors import ConfigError
from downpour_lib.perf.calibration import Calibration
from downpour_lib.perf.perfmodel import predict
from downpour_lib.study import emulated_check
from downpour_lib.study.emulated_sandbox import check_links, nodes_for
from downpour_lib.study.scaling_plots import with_series
from downpour_lib.study.studies import run_emulated_sweep

ROOT = Path(__file__).resolve().parents[1]
#: a tiny emulated plan: mlp on digits, 20 ms a step, a few steps
TINY = {"model": "mlp", "dataset": "digits", "batch_size": 16, "steps": 6, "warmup_steps": 1}


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    with running_sandbox(tmp_path_factory.mktemp("slurm-emul"), nodes=2) as box:
        yield box


def test_the_sweep_runs_across_the_sandbox_hosts_once_per_link_rate(sandbox, tmp_path, monkeypatch):
    """allreduce at 1 and 5 workers (5 ranks: 4 on node1, 1 on node2) at 1gbit and 2mbit: every
    row says where it ran, each rate is a series of its own, the 5-rank runs span both hosts and
    are slower over the slow link (its 0.3 MB of gradients take ~1 s there, ~3 ms at 1gbit),
    and the borrowed sandbox is left running with its links unshaped."""
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")
    csv = tmp_path / "runs.csv"
    lines: list[str] = []
    ran_on = run_emulated_sweep(["allreduce"], [1, 5], [0.02], TINY, csv=csv, links=["1gbit", "2mbit"],
                                sandbox_dir=sandbox.dir, log=lines.append)
    assert ran_on == "sandbox" and any("multi-node Slurm sandbox" in line for line in lines), lines
    runs = with_series(pd.read_csv(csv))
    assert (runs.compute == "emulated").all() and len(runs) == 4
    assert sorted(zip(runs["where"], runs.world_size, strict=True)) == [
        ("sandbox 1gbit", 1), ("sandbox 1gbit", 5), ("sandbox 2mbit", 1), ("sandbox 2mbit", 5)]
    assert set(runs.series) == {"allreduce (emulated, 20 ms a step, sandbox 1gbit)",
                                "allreduce (emulated, 20 ms a step, sandbox 2mbit)"}
    five = runs[runs.world_size == 5].set_index("where")
    assert (five.hosts == "node1,node2").all() and (five.backend == "gloo").all()
    assert five.step_s["sandbox 2mbit"] > 3 * five.step_s["sandbox 1gbit"], five.step_s
    assert sandbox.status().running
    assert [n.shaping for n in sandbox.status().nodes] == ["none", "none"]
    # resumable: a second sweep finds every run in the CSV and starts nothing
    again: list[str] = []
    run_emulated_sweep(["allreduce"], [1, 5], [0.02], TINY, csv=csv, links=["1gbit", "2mbit"],
                       sandbox_dir=sandbox.dir, log=again.append)
    assert len(pd.read_csv(csv)) == 4 and any("already in" in line for line in again), again


def test_bad_link_rates_are_refused_naming_the_field():
    with pytest.raises(ConfigError, match="emulated_links.*1 gigabit"):
        check_links(["1 gigabit"])
    with pytest.raises(ConfigError, match="emulated_links.*each rate once"):
        check_links(["1gbit", "1gbit"])
    with pytest.raises(ConfigError, match="emulated_links"):
        run_emulated_sweep(["allreduce"], [1, 2], [0.05], csv="unused.csv", links=["fast"])


def test_hosts_hold_four_ranks_each():
    assert [nodes_for(n) for n in (1, 4, 5, 8, 32, 33)] == [1, 1, 2, 2, 8, 9]


def test_a_sandbox_series_is_modelled_with_its_shaped_link_four_ranks_a_host():
    """The same measured steps, once local and once as sandbox series at two rates: the model
    predicts the shaped rate between hosts of 4 (slower at 1gbit than at 10gbit, past one host),
    and the local series with every rank on one node (no slower link at all)."""
    cal = Calibration.from_dict(json.loads(
        (ROOT / "results" / "reference" / "scaling" / "calibration.json").read_text()))
    # a core for every rank (the reference's own 2 cores would time-share the step's CPU work)
    cal = replace(cal, network=replace(cal.network, cores=None, wake_s=0.0))
    rows = [{"algorithm": "allreduce", "model": "inception_small", "batch_size": 32,
             "compute": "emulated", "emulated_step_s": 0.05, "num_workers": n, "world_size": n,
             "step_s": 0.05 + 0.01 * n, "comm_s": 0.0, "wait_s": 0.0, "compute_s": 0.05,
             "update_s": 0.0} for n in (1, 4, 8, 32)]
    runs = pd.DataFrame([{**r, "where": w} for w in ("local", "sandbox 10gbit", "sandbox 1gbit")
                         for r in rows])
    table = emulated_check.emulated_vs_model(runs, cal).set_index(["series", "workers"])
    step = table.predicted_step_s
    fast, slow = ("allreduce (emulated, 50 ms a step, sandbox 10gbit)",
                  "allreduce (emulated, 50 ms a step, sandbox 1gbit)")
    local = "allreduce (emulated, 50 ms a step)"
    assert step[fast, 4] == pytest.approx(step[slow, 4])  # one host: no link crossed
    assert step[slow, 32] > 1.5 * step[fast, 32]
    # the 1gbit series against the model by hand: 4 ranks a host, 125 MB/s between hosts
    base = float(runs[(runs["where"] == "sandbox 1gbit") & (runs.num_workers == 1)].step_s.iloc[0])
    from downpour_lib.perf.netmodel import Link

    here = replace(cal, network=replace(cal.network, per_node=4,
                                        inter=Link(cal.network.inter.alpha_s, 125e6)),
                   workloads={"inception_small": replace(cal.workload("inception_small"),
                                                         compute_s=base, batch_size=32)})
    assert step[slow, 32] == pytest.approx(predict(here, "allreduce", 32, "inception_small").step_s)
    assert step[local, 32] < step[slow, 32]


def test_study_links_go_with_emulated_compute(tmp_path, capsys):
    from downpour_lib.cli import main

    assert main(["study", "--links", "1gbit", "--out", str(tmp_path)]) != 0
    assert "links" in capsys.readouterr().err and not (tmp_path / "runs.csv").exists()


def test_each_link_rate_of_an_algorithm_has_a_line_of_its_own():
    from downpour_lib.study.scaling_plots import _link_styles

    names = pd.Series(["allreduce (emulated, 50 ms a step, sandbox 1gbit)",
                       "allreduce (emulated, 50 ms a step, sandbox 10gbit)",
                       "allreduce (emulated, 50 ms a step)", "allreduce"])
    styles = _link_styles(names)
    assert styles == {names[1]: "s-.", names[0]: "v:"}  # the local and real lines keep theirs


def test_an_empty_sweep_runs_nothing_and_says_so_not_where_it_ran(tmp_path):
    """emulated_workers=[]: notebook 02 said "the emulated points ran on this machine's ranks"."""
    from downpour_lib.study.studies import emulated_where

    csv = tmp_path / "runs.csv"
    lines = []
    ran_on = run_emulated_sweep(["allreduce"], [], [0.05], TINY, csv=csv, log=lines.append)
    assert ran_on == "none" and not csv.exists() and lines == []
    assert emulated_where(ran_on).startswith("no emulated points")
    assert emulated_where("local") == ("the emulated points ran on this machine's ranks (the "
                                       "CSV's `where`: local)")
    assert "the engines of the slurm-mpi cluster" in emulated_where("local", profile="slurm-mpi")
    assert emulated_where("sandbox", ["1gbit", "2mbit"]).endswith("sandbox, at 1gbit, 2mbit")
