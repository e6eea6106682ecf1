"""The gossip algorithms under mpiexec -n 4 (one launch, tests/mpi/gossip.py), against references:
push-sum's conserved mass, the product of the mixing matrices, the exact average; and accuracy
(trained in the digits job, tests/mpi/digits.py)."""

import json
import math

import pytest
from conftest import explain, mpi_python, one_session

from downpour_lib.data import load_dataset
from downpour_lib.models import build_model, parameter_count

N = 4


@pytest.fixture(scope="module")
def cases():
    proc = mpi_python(N, "gossip.py", timeout=600)
    assert proc.returncode == 0, explain(proc)
    out = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {c["case"]: c for c in out}


MIXING = ["sgp exponential", "sgp exponential 2 peers", "sgp ring", "sgp complete", "osgp exponential lag 1",
          "osgp exponential lag 2", "dpsgd ring", "dpsgd complete", "adpsgd bipartite"]


def test_every_case_ran(cases):
    assert list(cases) == MIXING


@pytest.mark.parametrize("case", MIXING)
def test_gossip_conserves_the_weighted_sum_of_parameters(cases, case):
    c = cases[case]
    assert c["mass_rel_err"] < 1e-6, c  # sum_i w_i z_i: push-sum's invariant (D-PSGD's too)
    assert abs(c["weight_sum"] - N) < 1e-5, c
    assert c["distances"][0] > 0.5  # the ranks did start apart


@pytest.mark.parametrize("case", [c for c in MIXING if not c.startswith("osgp")])
def test_gossip_equals_the_product_of_its_mixing_matrices(cases, case):
    # zero gradients: each rank's parameters are (P_T ... P_1 x(0))_i from mixing.py's matrices
    assert cases[case]["reference_err"] < 1e-6, cases[case]


@pytest.mark.parametrize("case", ["sgp complete", "dpsgd complete"])
def test_one_gossip_step_on_the_complete_graph_is_the_exact_average(cases, case):
    c = cases[case]
    assert len(c["distances"]) == 2 and c["mean_err"] < 1e-6, c
    assert c["distances"][1] < 1e-6 * c["distances"][0]


def test_consensus_distance_shrinks_geometrically(cases):
    # ring of 4 with weights 1/3: the disagreement shrinks by exactly 1/3 per step
    for case in ("sgp ring", "dpsgd ring"):
        d = cases[case]["distances"]
        for before, after in zip(d, d[1:], strict=False):
            assert after <= before / 3 * (1 + 1e-4), (case, d)
        assert d[-1] < d[0] * 3.0 ** -(len(d) - 1) * 1.01
    # exponential graph on 4 (a power of two): log2(4) = 2 steps average exactly
    d = cases["sgp exponential"]["distances"]
    assert d[1] < 0.75 * d[0] and d[2] < 1e-6 * d[0], d
    # bipartite pairs: 2 rounds reach everyone as well. AD-PSGD's thread runs them when it can,
    # but with max_lag=2 the update of step 3 waits for rounds 0 and 1: by then it is exact
    d = cases["adpsgd bipartite"]["distances"]
    assert d[4] < 1e-6 * d[0], d


def test_overlap_sgp_leaves_messages_in_flight_for_a_step(cases):
    c = cases["osgp exponential lag 1"]
    raw, landed = c["raw_distances"], c["distances"]
    # step 0's messages are still travelling after step 0: the parameters have not moved yet...
    assert raw[1] == pytest.approx(raw[0], rel=1e-9)
    # ...they land one step later, where SGP is after one step; and nothing is lost at the end
    sgp = cases["sgp exponential"]["distances"]
    assert raw[2] == pytest.approx(sgp[1], rel=1e-5)
    assert landed[1] == pytest.approx(sgp[1], rel=1e-5)  # what is evaluated includes them
    assert c["mean_err"] < 1e-6
    assert cases["osgp exponential lag 2"]["mean_err"] < 1e-6


@pytest.mark.parametrize("name", ["sgp", "osgp", "dpsgd", "adpsgd"])
def test_each_gossip_method_reaches_90_percent_on_digits(digits_runs, name):
    c = digits_runs[name]
    assert c["test_accuracy"] >= 0.90, c
    assert c["num_workers"] == N and c["eval_ranks"] == [0]  # rank 0's model is evaluated
    # consensus distance is recorded at every evaluation point, and the ranks do disagree
    assert len(c["eval_consensus"]) == 3 and all(0 < d < 1 for d in c["eval_consensus"]), c
    assert c["final_consensus_distance"] == c["eval_consensus"][-1]


def test_bytes_per_step_do_not_grow_with_the_graph_for_one_peer(digits_runs):
    splits = load_dataset("digits")
    n_params = parameter_count(build_model("lenet", splits.train.input_shape,
                                           splits.train.num_classes))
    model_bytes = 4 * n_params
    # push-sum: one model plus its weight to one peer per step, one received
    for name in ("sgp", "osgp"):
        c = digits_runs[name]
        assert c["bytes_sent_per_step"] == c["bytes_received_per_step"] == model_bytes + 4, c
    # D-PSGD on a ring: the model to and from both neighbours
    c = digits_runs["dpsgd"]
    assert c["bytes_sent_per_step"] == c["bytes_received_per_step"] == 2 * model_bytes, c
    # AD-PSGD: one pairwise exchange per step
    c = digits_runs["adpsgd"]
    assert c["bytes_sent_per_step"] == c["bytes_received_per_step"] == model_bytes, c
    assert not math.isnan(digits_runs["osgp"]["staleness_mean"])


GOSSIP = ("sgp", "osgp", "dpsgd", "adpsgd")


@pytest.fixture(scope="module")
def on_mpi(tmp_path_factory):
    """Each gossip algorithm's short run, one after another in one mpiexec session on ``auto``."""
    return one_session(N, {algorithm: {
        "algorithm": algorithm, "model": "mlp", "dataset": "digits", "steps": 20, "eval_every": 10,
        "threads": 1} for algorithm in GOSSIP}, tmp_path_factory.mktemp("on_mpi"))


@pytest.mark.parametrize("algorithm", GOSSIP)
def test_gossip_runs_on_the_mpi_backend(on_mpi, algorithm):
    """The scripts above pin gloo; `auto` under mpiexec is the mpi backend, which has no batched
    point-to-point and no per-group destroy: the gossip paths must not need either (nor leave
    anything behind that the next run in the same session trips on)."""
    summary = on_mpi[algorithm]
    assert summary["backend"] == "mpi" and summary["test_accuracy"] > 0.2, summary
