"""The gossip algorithms in one process: options, world checks, the CLI, the averaging thread.

(Their multi-rank behaviour is in test_gossip_multirank.py, under mpiexec.)
"""

import dataclasses
import threading

import pytest
import torch
from conftest import explain, mpi_python

from downpour_lib import TrainConfig, make_trainer
from downpour_lib.algorithms import ALGORITHMS
from downpour_lib.algorithms.adpsgd import PairwiseAveraging
from downpour_lib.cli import main
from downpour_lib.comm.runtime import DistContext
from downpour_lib.errors import ConfigError
from downpour_lib.options import ADPSGDOptions, DPSGDOptions, OSGPOptions, SGPOptions
from downpour_lib.study.scaling import StudySpec
from downpour_lib.topology import make_topology

GOSSIP = ("sgp", "osgp", "dpsgd", "adpsgd")
TINY = dict(model="mlp", dataset="digits", steps=12, warmup_steps=1, threads=1, seed=5,
            eval_every=4)


def final_parameters(config: TrainConfig):
    trainer = make_trainer(config, DistContext.single())
    result = trainer.run()
    return [p.detach().clone() for p in trainer.model.parameters()], result


@pytest.mark.parametrize("name", GOSSIP)
def test_in_a_world_of_one_every_gossip_method_is_plain_sgd(name):
    # no peers: no message, push-sum weight 1, no averaging thread; exactly `local` training
    ref, _ = final_parameters(TrainConfig(algorithm="local", **TINY))
    got, result = final_parameters(TrainConfig(algorithm=name, **TINY))
    for g, r in zip(got, ref, strict=True):
        torch.testing.assert_close(g, r, rtol=0, atol=0)
    assert result.evals.consensus_distance.tolist() == [0.0, 0.0, 0.0]
    assert result.summary["final_consensus_distance"] == 0.0
    assert (result.steps.bytes_sent == 0).all()


def test_bad_options_name_the_field_the_value_and_the_fix():
    with pytest.raises(ConfigError, match="topology='torus' is not valid: choose one of "
                                          "exponential, ring, complete"):
        SGPOptions(topology="torus")
    with pytest.raises(ConfigError, match="topology='exponential' is not valid: choose one of "
                                          "ring, complete"):
        DPSGDOptions(topology="exponential")  # directed: D-PSGD averages symmetrically
    with pytest.raises(ConfigError, match="max_lag=-1 .*use --algorithm sgp"):
        OSGPOptions(max_lag=-1)
    with pytest.raises(ConfigError, match="max_lag=0 .*use --algorithm sgp"):
        OSGPOptions(max_lag=0)  # lag 0 would be SGP itself: not a switch on osgp
    with pytest.raises(ConfigError, match="max_lag=0 .*use --algorithm dpsgd"):
        ADPSGDOptions(max_lag=0)
    with pytest.raises(ConfigError, match="peers_per_step=2 .*applies to topology='exponential'"):
        SGPOptions(topology="ring", peers_per_step=2)
    with pytest.raises(ConfigError, match="peers_per_step=0"):
        OSGPOptions(peers_per_step=0)
    # options are frozen, so a checked value stays checked
    with pytest.raises(dataclasses.FrozenInstanceError):
        SGPOptions().topology = "ring"


def check_world(config: TrainConfig, world_size: int) -> None:
    config.options.roles(world_size)


def test_world_checks_refuse_graphs_that_do_not_fit():
    adpsgd = TrainConfig(algorithm="adpsgd")
    with pytest.raises(ConfigError) as err:
        check_world(adpsgd, 3)
    assert (err.value.field, err.value.value) == ("world_size", 3) and "launch 2 or 4 ranks" in str(err.value)
    assert "bipartite_exponential' (its default and only one)" in str(err.value)
    for ok in (1, 2, 4, 6):
        check_world(adpsgd, ok)
    sgp3 = TrainConfig(algorithm="sgp", options={"peers_per_step": 3})
    with pytest.raises(ConfigError, match="peers_per_step=3 .*use at most 2"):
        check_world(sgp3, 4)
    check_world(sgp3, 8)  # hops 1, 2, 4
    check_world(sgp3, 1)  # a world of one has no peers to count
    # every gossip method runs on any world its graph fits, 1 included
    for name in GOSSIP:
        check_world(TrainConfig(algorithm=name), 1)
        check_world(TrainConfig(algorithm=name), 2)


def test_cli_rejects_bad_gossip_options_before_training(capsys):
    assert main(["train", "--algorithm", "osgp", "--max-lag", "-1", "--steps", "3"]) == 2
    err = capsys.readouterr().err
    assert "max_lag=-1 is not valid" in err and "--algorithm sgp" in err
    assert main(["train", "--algorithm", "sgp", "--topology", "torus", "--steps", "3"]) == 2
    assert "choose one of exponential, ring, complete" in capsys.readouterr().err
    assert main(["train", "--algorithm", "dpsgd", "--peers-per-step", "2"]) == 2
    assert "has no such option; it is an option of sgp, osgp (its options: topology)" \
        in capsys.readouterr().err


def test_study_refuses_a_world_a_gossip_method_cannot_run_in():
    runs = StudySpec(algorithms=GOSSIP, workers=(1, 2, 4), repeats=1).runs()
    assert [(c.algorithm, n) for c, n, _ in runs] == [(a, n) for a in GOSSIP for n in (1, 2, 4)]
    with pytest.raises(ConfigError, match="even number of ranks"):
        StudySpec(algorithms=("adpsgd",), workers=(3,)).runs()


def test_every_gossip_method_is_registered_with_its_paper():
    for name in GOSSIP:
        cls = ALGORITHMS[name]
        doc = __import__(cls.__module__, fromlist=["_"]).__doc__
        assert "ICML" in doc or "NeurIPS" in doc, name


def test_averaging_thread_errors_reach_the_training_thread():
    # No process group here, so the thread's first exchange fails: the error must surface in the
    # caller (not be swallowed), and close() must not hang.
    topology = make_topology("bipartite_exponential", 2)
    averaging = PairwiseAveraging(torch.zeros(4), topology, rank=1, group=None)
    assert not any(t.name == "adpsgd-averaging-1" for t in threading.enumerate())  # not by __init__
    averaging.start()
    with pytest.raises(RuntimeError, match="already started"):
        averaging.start()
    averaging.release_round()
    with pytest.raises(RuntimeError, match="averaging thread of rank 1 failed") as err:
        averaging.wait_for(1)
    assert err.value.__cause__ is not None  # the thread's own exception is chained
    with pytest.raises(RuntimeError, match="averaging thread of rank 1 failed"):
        averaging.close()
    with pytest.raises(RuntimeError, match="averaging thread of rank 1 failed"):
        averaging.release_round()


def test_averaging_thread_closes_cleanly_with_nothing_to_do():
    averaging = PairwiseAveraging(torch.zeros(4), make_topology("bipartite_exponential", 2), 0, None)
    before = threading.active_count()
    averaging.start()
    averaging.close()  # no round released: the thread ends without talking to anyone
    assert threading.active_count() == before


def test_a_failing_rank_ends_an_adpsgd_job_with_its_averaging_threads():
    # rank 1 raises mid-training; its peers' averaging threads are blocked on it. The job must
    # end (the subprocess timeout is the guard against a hang) and name the rank that failed.
    proc = mpi_python(4, "failing_rank.py", "adpsgd", timeout=180)
    assert proc.returncode != 0, explain(proc)
    assert "rank 1 of 4 failed: RuntimeError: injected failure for the test" in proc.stderr
