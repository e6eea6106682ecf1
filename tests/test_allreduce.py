"""The collectives layer and AllReduce SGD: real multi-rank runs under mpiexec, and the world of one."""

import json

import pytest
import torch
import torch.nn.functional as F
from conftest import explain, mpi_python
from torch import nn

from downpour_lib import TrainConfig, comm, train
from downpour_lib.algorithms import make_algorithm
from downpour_lib.comm.model_sync import first_mismatch, signature
from downpour_lib.comm.runtime import DistContext
from downpour_lib.errors import ConfigError

CASES = ["collectives", "groups", "synchronize_parameters", "allreduce sgd = one process",
         "allreduce sgd, small buckets = one process", "allreduce sgd = ddp",
         "accumulation k=3 = one step on the 3x batch", "compression fp16", "compression bf16",
         "unused parameters, one bucket", "unused parameters, small buckets"]
HIERARCHIES = {2: ["aa", "ab"], 3: ["aab", "aba"], 4: ["aabb", "aaab", "abab"]}


@pytest.mark.parametrize("n, backend", [(2, "gloo"), (3, "gloo"), (4, "gloo"), (3, "mpi")])
def test_collectives_groups_and_allreduce_sgd_under_mpiexec(n, backend):
    proc = mpi_python(n, "collectives.py", backend)
    assert proc.returncode == 0, explain(proc)
    cases = {c["case"]: c for c in map(json.loads, (x for x in proc.stdout.splitlines()
                                                    if x.startswith("{")))}
    assert set(cases) == set(CASES) | {f"hierarchy {h}" for h in HIERARCHIES[n]}, explain(proc)
    assert all(c["ok"] for c in cases.values()), explain(proc)
    for name in ("allreduce sgd = one process", "allreduce sgd = ddp",
                 "accumulation k=3 = one step on the 3x batch"):
        assert cases[name]["max_abs_diff"] < 1e-5 and cases[name]["reference_moved"] > 1e-2
    for wire in ("fp16", "bf16"):  # rounded, but within the dtype's bound
        assert cases[f"compression {wire}"]["worst_error_over_bound"] <= 1.0


# -- a world of one ---------------------------------------------------------------------------------

def test_collectives_are_no_ops_in_a_world_of_one():
    x = torch.arange(4.0)
    assert comm.allreduce(x, op="mean") is x and torch.equal(x, torch.arange(4.0))
    handle = comm.broadcast([x, x * 2], async_op=True)
    assert handle.is_completed() and handle.wait()[0] is x
    assert comm.allgather(x)[0] is x
    assert comm.reduce_scatter(x) is x
    assert torch.equal(comm.reduce_scatter([x, torch.ones(2)]), torch.cat([x, torch.ones(2)]))
    with pytest.raises(ValueError, match="op='median' is not valid"):
        comm.allreduce(x, op="median")
    with pytest.raises(TypeError, match="needs one dtype"):
        comm.allreduce([x, torch.ones(2, dtype=torch.int64)], async_op=True)


def test_node_groups_and_leaders_from_host_names():
    hosts = ["n2", "n1", "n2", "n1", "n3"]
    assert comm.node_groups(hosts) == [(0, 2), (1, 3), (4,)]
    assert comm.node_leaders(hosts) == (0, 1, 4)
    assert comm.node_groups(["a"] * 3) == [(0, 1, 2)] and comm.node_leaders(["a"] * 3) == (0,)
    assert comm.shard_bounds(14, 4, 3) == (12, 16)


def test_first_mismatch_names_the_parameter_and_the_ranks():
    small, wide = nn.Linear(4, 2), nn.Linear(5, 2)
    sigs = [signature(small), signature(small), signature(wide), signature(wide)]
    message = first_mismatch(sigs)
    assert message.startswith("parameter 'weight' differs on rank(s) 2, 3 from rank 0")
    assert "rank 2 has shape (2, 5)" in message
    assert first_mismatch([signature(small)] * 3) is None
    bn = nn.Sequential(nn.Linear(4, 2), nn.BatchNorm1d(2))
    message = first_mismatch([signature(bn), signature(nn.Sequential(nn.Linear(4, 2)))])
    assert message.startswith("parameter '1.weight' differs on rank(s) 1") and "has no parameter" in message


def test_allreduce_options_are_validated():
    for bad, match in [({"bucket_cap_mb": 0}, "bucket_cap_mb=0"),
                       ({"compression": "int8"}, "compression='int8'"),
                       ({"accumulation_steps": 0}, "accumulation_steps=0")]:
        with pytest.raises(ConfigError, match=match):
            TrainConfig(algorithm="allreduce", options=bad)


def test_allreduce_with_accumulation_in_one_process_equals_the_k_times_batch():
    base = dict(model="mlp", dataset="digits", lr=0.05, momentum=0.9, weight_decay=1e-4, seed=1,
                threads=1, warmup_steps=0)
    acc = train(TrainConfig(**base, algorithm="allreduce", batch_size=8, steps=12,
                            options={"accumulation_steps": 4}))
    ref = train(TrainConfig(**base, algorithm="local", batch_size=32, steps=3))
    assert abs(acc.summary["test_loss"] - ref.summary["test_loss"]) < 1e-5
    assert acc.summary["test_loss"] != train(TrainConfig(**base, algorithm="local", batch_size=8,
                                                         steps=12)).summary["test_loss"]


def test_a_second_backward_before_after_backward_is_an_error():
    model = nn.Linear(3, 2)
    alg = make_algorithm("allreduce", DistContext.single(), accumulation_steps=2)
    alg.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x = torch.randn(4, 3)
    F.mse_loss(model(x), torch.zeros(4, 2)).backward()
    with pytest.raises(RuntimeError, match="second gradient before after_backward"):
        F.mse_loss(model(x), torch.zeros(4, 2)).backward()
    alg.close()


def test_a_run_that_ends_inside_an_accumulation_window_warns():
    with pytest.warns(UserWarning, match="last 1 micro-batch"):
        train(TrainConfig(model="mlp", dataset="digits", algorithm="allreduce", steps=5,
                          warmup_steps=0, threads=1, options={"accumulation_steps": 2}))


def test_buckets_follow_the_order_backward_produces_gradients():
    class Reversed(nn.Module):  # registered last-used first: reverse registration order is wrong
        def __init__(self):
            super().__init__()
            self.late, self.early = nn.Linear(8, 3), nn.Linear(5, 8)

        def forward(self, x):
            return self.late(torch.relu(self.early(x)))

    from downpour_lib.comm.buckets import GradientBuckets
    from downpour_lib.records import Meter

    torch.manual_seed(0)
    model, plain = Reversed(), Reversed()
    plain.load_state_dict(model.state_dict())
    buckets = GradientBuckets(list(model.named_parameters()),
                              comm.Communicator((0,), None, 0, Meter()), bucket_bytes=64)
    buckets.start()
    before = [buckets.names[i] for i in buckets.order]
    for _ in range(3):
        x = torch.randn(4, 5)
        model.zero_grad(set_to_none=True)
        plain.zero_grad(set_to_none=True)
        model(x).square().sum().backward()
        plain(x).square().sum().backward()
        assert buckets.after_backward()
        for p, q in zip(model.parameters(), plain.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0)
    after = [buckets.names[i] for i in buckets.order]
    assert before == ["early.bias", "early.weight", "late.bias", "late.weight"]
    assert after[:2] == ["late.bias", "late.weight"] or after[:2] == ["late.weight", "late.bias"]
    assert len(buckets.buckets) > 1
    buckets.close()
