"""``downpour bench train``: real launches at 1 and 2 ranks, rows that add up, bad backends refused."""

import json

import pytest

from downpour_lib.cli import main

FIELDS = {"algorithm", "backend", "model", "world_size", "samples_per_s", "scaling_efficiency",
          "exposed_comm_s"}


def test_bench_train_runs_1_and_2_ranks_and_writes_rows(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["bench", "train", "--model", "mlp", "--dataset", "synthetic-mnist",
                 "--algorithms", "allreduce", "--backends", "gloo", "--steps", "8",
                 "--warmup-steps", "3", "--json", str(out)]) == 0, capsys.readouterr()
    rows = json.loads(out.read_text())
    assert [(r["algorithm"], r["backend"], r["world_size"]) for r in rows] == [
        ("allreduce", "gloo", 1), ("allreduce", "gloo", 2)]
    one, two = rows
    assert FIELDS <= set(one) and one["model"] == "mlp"
    assert one["scaling_efficiency"] == 1.0 and one["exposed_comm_s"] == 0.0
    assert two["scaling_efficiency"] == pytest.approx(two["samples_per_s"] / (2 * one["samples_per_s"]))
    assert two["exposed_comm_s"] > 0 and two["bytes_sent_per_step"] > 0
    assert "allreduce  gloo" in capsys.readouterr().out


@pytest.mark.parametrize("args, expected", [
    (["--backends", "gloo,nonesuch"], "backends='nonesuch' is not valid: this build has no "
                                      "'nonesuch' backend; use one of gloo"),
    (["--algorithms", "allreduce,nope"], "algorithms='nope'"),
    (["--workers", "1"], "give worker counts >= 2"),
    (["--model", "nope"], "model='nope'"),
])
def test_bench_train_refuses_bad_input_before_launching(capsys, args, expected):
    assert main(["bench", "train", *args]) == 2
    captured = capsys.readouterr()
    assert expected in captured.err and "rank(s)" not in captured.out
