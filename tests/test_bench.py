"""``downpour bench train``: real launches at 1 and 2 ranks, rows that add up, bad backends refused;
the collective benchmarks' timing loop, which writes the buffers before every call with ``--written``."""

import argparse
import json

import pytest
import torch
from conftest import downpour, explain

from downpour_lib.bench.gpu import measure, table
from downpour_lib.cli import main

FIELDS = {"algorithm", "backend", "model", "world_size", "samples_per_s", "scaling_efficiency",
          "exposed_comm_s"}


@pytest.mark.slow  # 60 s on CI
def test_bench_train_runs_1_and_2_ranks_and_writes_rows(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["bench", "train", "--model", "mlp", "--dataset", "synthetic-mnist",
                 "--algorithms", "allreduce", "--backends", "gloo", "--steps", "8",
                 "--warmup-steps", "3", "--repeats", "2", "--json", str(out)]) == 0, capsys.readouterr()
    rows = json.loads(out.read_text())
    assert [(r["algorithm"], r["backend"], r["world_size"]) for r in rows] == [
        ("plain loop", "none", 1), ("allreduce", "gloo", 1), ("allreduce", "gloo", 2),
        ("independent", "none", 1), ("independent", "none", 2)]
    plain, one, two, solo, pair = rows
    # each worker's own rate against the plain PyTorch loop's, round by round
    per_worker = [a / 2 / b for a, b in zip(two["samples_per_s_runs"], plain["samples_per_s_runs"],
                                            strict=True)]
    assert two["per_worker_vs_plain"] == pytest.approx(sum(per_worker) / 2)
    assert plain["per_worker_vs_plain"] == pytest.approx(1.0) and plain["samples_per_s"] > 0
    # the ceiling: two copies of `local` at once, never communicating
    assert pair["scaling_efficiency"] == pytest.approx(pair["samples_per_s"] / (2 * solo["samples_per_s"]))
    assert pair["exposed_comm_s"] == 0.0 and pair["bytes_sent_per_step"] == 0.0
    assert FIELDS <= set(one) and one["model"] == "mlp"
    assert one["scaling_efficiency"] == 1.0 and one["exposed_comm_s"] == 0.0
    assert two["scaling_efficiency"] == pytest.approx(two["samples_per_s"] / (2 * one["samples_per_s"]))
    assert two["exposed_comm_s"] > 0 and two["bytes_sent_per_step"] > 0
    for row in rows:  # two rounds, each point the median of its runs
        assert len(row["samples_per_s_runs"]) == 2 and row["repeats"] == 2, row
        assert row["samples_per_s"] == pytest.approx(sum(row["samples_per_s_runs"]) / 2), row
    # against the ceiling of the same size, round by round
    ratios = [a / b for a, b in zip(two["samples_per_s_runs"], pair["samples_per_s_runs"], strict=True)]
    assert two["vs_ceiling"] == pytest.approx(sum(ratios) / 2)
    assert pair["vs_ceiling"] == pytest.approx(1.0) and solo["vs_ceiling"] == pytest.approx(1.0)
    out = capsys.readouterr().out
    assert "allreduce    gloo" in out and "independent  none" in out
    assert out.index("[1/2] independent none  2 process(es)") < out.index("[2/2] plain loop  1 process")
    assert out.index("[2/2] plain loop  1 process") < out.index("[2/2] allreduce   gloo  1 rank(s)")


@pytest.mark.parametrize("args, expected", [
    (["--backends", "gloo,nonesuch"], "backends='nonesuch' is not valid: this build has no "
                                      "'nonesuch' backend; use one of gloo"),
    (["--algorithms", "allreduce,nope"], "algorithms='nope'"),
    (["--workers", "1"], "give worker counts >= 2"),
    (["--algorithms", "local"], "algorithms='local'"),
    (["--model", "nope"], "model='nope'"),
])
def test_bench_train_refuses_bad_input_before_launching(capsys, args, expected):
    assert main(["bench", "train", *args]) == 2
    captured = capsys.readouterr()
    assert expected in captured.err and "rank(s)" not in captured.out


def test_bench_gpu_refuses_a_pipeline_with_nothing_to_time():
    proc = downpour("bench", "gpu", "--pipeline-rounds", "0")
    assert proc.returncode == 2, explain(proc)
    assert "pipeline_rounds=0 is not valid" in proc.stderr, explain(proc)


def test_bench_gpu_without_cuda_says_so_and_exits_0(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: make gpu-check runs the benchmark")
    proc = downpour("bench", "gpu", "--json", str(tmp_path / "g.json"))
    assert proc.returncode == 0, explain(proc)
    assert "no CUDA device" in proc.stdout and not (tmp_path / "g.json").exists()


def test_bench_gpu_measures_each_algorithm_against_the_plain_loop_and_the_pipeline():
    """The benchmark's measuring code, on the CPU with a small model (the numbers mean little
    here; that it measures every row does)."""
    args = argparse.Namespace(model="mlp", dataset="synthetic-cifar", batch_size=16, precision="bf16",
                              steps=6, warmup_steps=2, algorithms="local,allreduce,sync_ps",
                              images=48, data_workers=1, pipeline_rounds=2)
    rows = measure(args, torch.device("cpu"))
    assert [r["what"] for r in rows] == ["plain PyTorch loop", "plain loop, batch resident on the GPU",
                                         "local", "allreduce", "sync_ps",
                                         "imagefolder pipeline (1 workers)"]
    assert all(r["images_per_s"] > 0 and r["vs_plain"] > 0 for r in rows), rows
    resident = rows[1]["images_per_s"]
    assert all(r["vs_resident"] == pytest.approx(r["images_per_s"] / resident) for r in rows)
    lines = table(rows)
    # an algorithm's overhead is what it costs beyond the model alone (the resident loop)
    allreduce = next(line for line in lines if line.startswith("allreduce"))
    assert allreduce.split()[-1] == f"{(1 - rows[3]['vs_resident']) * 100:.1f}%"
    assert not lines[1].rstrip().endswith("%") and len(lines) == len(rows) + 1


@pytest.mark.parametrize("written", [True, False])
def test_bench_timing_writes_the_buffers_before_every_call_only_when_written(written):
    """``--written``: every call the benchmark makes, warm-ups and untimed ones included, finds the
    buffers written since its last call, as training writes its gradients; a group whose path
    depends on whether its second call sends an unchanged buffer (``routing.Undecided``) decided
    "reused" on two warm-up calls without a write between them. Without it, nothing is written."""
    from downpour_lib.bench.timing import Sync, measure_paired
    from downpour_lib.comm import Communicator

    state = {"writes": 0, "calls": 0, "unwritten": 0}

    def touch():
        state["writes"] += 1
        state["fresh"] = True

    def call():
        state["calls"] += 1
        state["unwritten"] += not state.pop("fresh", False)

    args = argparse.Namespace(written=written, warmup=2, min_reps=4, max_reps=6, min_time=0.0)
    times = measure_paired([call, call], Sync(Communicator.world()), args, touch)
    assert [len(t) for t in times] == [4, 4] and all(x >= 0 for t in times for x in t), times
    # 2 warm-ups + 1 estimate each, then per turn one untimed call and the timed ones
    assert state["calls"] >= 2 * (2 + 1 + 4), state
    if written:
        assert state["unwritten"] == 0 and state["writes"] == state["calls"], state
    else:
        assert state["writes"] == 0 and state["unwritten"] == state["calls"], state
