"""What a run tells its user: progress in a batch log, divergence as an error, and the settings
that used to run quietly as something else (one worker, an empty checkpoint directory, a resume).
"""

import io
import re

import pandas as pd
import pytest
import torch
from conftest import BIN, downpour, explain, mpiexec

from downpour_lib import TrainConfig, make_trainer, plan_run
from downpour_lib.cli import main
from downpour_lib.comm.runtime import DistContext
from downpour_lib.data import load_dataset
from downpour_lib.errors import Diverged
from downpour_lib.progress import ProgressLines

LINE = re.compile(r"^downpour: allreduce x2: step (\d+) of (\d+) \((\d+)%\), ([\d.]+) samples/s, "
                  r"loss ([\d.]+), \d+:\d\d:\d\d elapsed, \d+:\d\d:\d\d left$", re.M)
TINY = ["--model", "mlp", "--dataset", "digits", "--threads", "1", "--final-eval", "false"]


def test_progress_lines_under_mpiexec():
    """Under mpiexec rank 0's stderr is a pipe: no bar, but a line every tenth of the run (at
    least a second apart) with the step, samples/s, loss and time left, the last at step N."""
    # one worker sleeps 30x its compute time, so the 20 steps last seconds on any machine
    proc = mpiexec(2, str(BIN / "downpour"), "train", "--algorithm", "allreduce", "--steps",
                   "20", "--warmup-steps", "1", "--batch-size", "16", "--slow-workers", "1",
                   "--slowdown", "30", *TINY, "--model", "lenet", timeout=300)
    assert proc.returncode == 0, explain(proc)
    lines = LINE.findall(proc.stderr)
    steps = [int(s) for s, *_ in lines]
    assert len(steps) >= 2 and steps == sorted(set(steps)) and steps[-1] == 20, explain(proc)
    assert all(int(n) == 20 and int(pct) == round(100 * int(s) / 20) for s, n, pct, *_ in lines)
    assert all(float(rate) > 0 for *_, rate, _ in lines)
    assert "\r" not in proc.stderr  # no bar redrawn into the log


def test_progress_lines_come_a_tenth_of_the_run_apart_and_end_at_the_last_step(monkeypatch):
    clock = iter(range(0, 1000, 2))  # each step takes 2 s: every tenth is due
    monkeypatch.setattr("downpour_lib.progress.time.perf_counter", lambda: float(next(clock)))
    out = io.StringIO()
    progress = ProgressLines(total=35, initial=5, desc="x", samples_per_step=64, out=out)
    progress.start()
    for _ in range(30):
        progress.set_loss(1.5)
        progress.update()
    steps = [int(m) for m in re.findall(r"step (\d+) of 35", out.getvalue())]
    assert steps == [8, 11, 14, 17, 20, 23, 26, 29, 32, 35], out.getvalue()
    # 3 steps in 6 s with 64 samples each: 32 samples/s; 27 steps left at 0.5 steps/s: 54 s
    assert "step 8 of 35 (23%), 32.0 samples/s, loss 1.5000, 0:00:06 elapsed, 0:00:54 left" \
        in out.getvalue()


def test_progress_lines_are_at_least_a_second_apart(monkeypatch):
    clock = iter(i * 0.01 for i in range(10_000))
    monkeypatch.setattr("downpour_lib.progress.time.perf_counter", lambda: next(clock))
    out = io.StringIO()
    progress = ProgressLines(total=1000, initial=0, desc="x", samples_per_step=1, out=out)
    progress.start()
    for _ in range(1000):
        progress.update()
    # 10 s in all: one line a second at most (the tenths come every second), and the last step
    assert 2 <= out.getvalue().count("\n") <= 11 and "step 1000 of 1000" in out.getvalue()


# -- divergence ----------------------------------------------------------------------------------

DIVERGING = dict(algorithm="sync_ps", model="mlp", dataset="digits", lr=1000.0, threads=1,
                 batch_size=32, warmup_steps=0, final_eval=False, seed=0)


def test_divergence_stops_at_the_first_non_finite_loss_in_one_process():
    with pytest.raises(Diverged, match=r"training diverged at step \d+ on rank 0: the train loss "
                                       r"is (nan|inf)") as info:
        make_trainer(TrainConfig(steps=40, **DIVERGING), DistContext.single()).run()
    first = info.value.step
    assert info.value.rank == 0 and first >= 1
    # the reference: the same run cut just before that step trains with finite losses throughout
    result = make_trainer(TrainConfig(steps=first, **DIVERGING), DistContext.single()).run()
    assert result.steps.loss.notna().all() and torch.isfinite(
        torch.tensor(result.steps.loss.to_numpy())).all()


def test_fp16_divergence_ends_when_the_loss_scale_can_fall_no_further():
    """fp16 skips an overflowed step (the scale halves) rather than calling it divergence; only
    when the scale is at its floor (1) and the step still overflows does the run end."""
    with pytest.raises(Diverged, match="fp16 gradients overflow even at the smallest loss scale"
                       ) as info:
        make_trainer(TrainConfig(steps=200, precision="fp16", **DIVERGING), DistContext.single()).run()
    before = make_trainer(TrainConfig(steps=info.value.step, precision="fp16", **DIVERGING),
                          DistContext.single())
    steps = before.run().steps
    # the steps before it ran to the end: overflowed ones skipped, halving the scale down to 1
    assert steps.skipped.sum() >= 16 and before.scaler.scale == 1.0


@pytest.mark.parametrize("ranks, algorithm", [(1, "sync_ps"), (3, "sync_ps")])
def test_lr_1000_exits_non_zero_naming_the_step_and_rank(ranks, algorithm):
    args = ["train", "--algorithm", algorithm, "--lr", "1000", "--steps", "60", *TINY]
    proc = downpour(*args) if ranks == 1 else mpiexec(ranks, str(BIN / "downpour"), *args,
                                                      timeout=300)
    assert proc.returncode != 0, explain(proc)
    found = re.findall(r"training diverged at step (\d+) on rank (\d+): the train loss is", proc.stderr)
    assert found, explain(proc)
    workers = {"0"} if ranks == 1 else {"1", "2"}  # rank 0 is sync_ps's server
    assert all(int(step) < 59 and rank in workers for step, rank in found), explain(proc)
    assert "final train loss" not in proc.stdout, explain(proc)


# -- settings that ran quietly as something else -------------------------------------------------

@pytest.mark.parametrize("algorithm, world, warned", [
    ("downpour", 1, "sequential SGD"), ("downpour", 2, "sequential SGD"),
    ("adpsgd", 1, "plain SGD"), ("downpour", 3, None), ("adpsgd", 2, None),
    ("allreduce", 1, None)])
def test_asynchronous_algorithms_with_one_worker_say_what_they_are(algorithm, world, warned):
    said = []
    plan_run(TrainConfig(algorithm=algorithm, model="mlp", dataset="digits", steps=5,
                         warmup_steps=0), world, load_dataset("digits").train, said.append)
    if warned is None:
        assert said == []
    else:
        assert len(said) == 1 and said[0].startswith(f"{algorithm} with one worker: ") \
            and warned in said[0] and "launch" in said[0], said


def test_downpour_on_one_rank_warns_on_the_command_line():
    proc = downpour("train", "--algorithm", "downpour", "--steps", "3", "--warmup-steps", "0",
                    *TINY)
    assert proc.returncode == 0, explain(proc)
    assert "downpour train: warning: downpour with one worker: " in proc.stderr, explain(proc)


def test_evaluate_on_a_directory_without_checkpoints_exits_2(tmp_path, capsys):
    assert main(["evaluate", "--checkpoint-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"checkpoint_dir='{tmp_path}' is not valid: holds no checkpoint: expected files " \
           "named ckpt-<step>.pt" in err, err


def test_evaluate_says_when_nothing_is_new_and_fails_when_nothing_reads(tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    make_trainer(TrainConfig(algorithm="local", model="mlp", dataset="digits", steps=4, threads=1,
                             warmup_steps=0, final_eval=False, checkpoint_dir=str(ckpt),
                             checkpoint_every=2), DistContext.single()).run()
    assert main(["evaluate", "--checkpoint-dir", str(ckpt)]) == 0
    assert "step 4: test loss" in capsys.readouterr().out
    assert len(pd.read_csv(ckpt / "evals.csv")) == 2
    assert main(["evaluate", "--checkpoint-dir", str(ckpt)]) == 0  # the CSV has both already
    assert f"nothing new: the checkpoints in {ckpt} are scored in {ckpt / 'evals.csv'} already" \
        in capsys.readouterr().out
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "ckpt-00000002.pt").write_bytes(b"not a checkpoint")
    assert main(["evaluate", "--checkpoint-dir", str(broken)]) == 2
    err = capsys.readouterr().err
    assert "skipping" in err and f"no checkpoint in {broken} could be read" in err, err
    # a GPU that is not there is the device's error, said once, not each checkpoint's failure
    import torch

    gpus = torch.cuda.device_count()
    assert main(["evaluate", "--checkpoint-dir", str(ckpt), "--device", f"cuda:{gpus}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "skipping" not in err, err
    assert err.startswith(f"downpour evaluate: error: device='cuda:{gpus}' is not valid: "
                          + (f"this node has {gpus} GPU(s)" if gpus else "CUDA is not available")), err


#: a run of a few milliseconds a step, for the checkpoint and resume messages below
QUICK = dict(algorithm="local", model="mlp", dataset="digits", threads=1, warmup_steps=0,
             final_eval=False)


def test_a_resumed_run_says_which_checkpoint_and_step_it_continues_from(tmp_path, capsys):
    base = dict(**QUICK, checkpoint_dir=str(tmp_path), checkpoint_every=2)
    make_trainer(TrainConfig(steps=4, **base), DistContext.single()).run()
    capsys.readouterr()
    result = make_trainer(TrainConfig(steps=6, resume=str(tmp_path), **base), DistContext.single()).run()
    assert result.summary["start_step"] == 4
    err = capsys.readouterr().err
    assert f"downpour: resumed from {tmp_path / 'ckpt-00000004.pt'}: 4 of 6 steps done, " \
           "continuing at step 4" in err, err


def test_a_run_resumed_from_a_checkpoint_file_says_it_writes_no_checkpoints(tmp_path, capsys):
    """--resume DIR/ckpt-N.pt with no --checkpoint-dir writes no checkpoints (beside the file it
    would replace a longer run's later ones): the run says so as it starts, not after its work."""
    base = QUICK
    make_trainer(TrainConfig(steps=4, checkpoint_dir=str(tmp_path), checkpoint_every=2, **base),
                 DistContext.single()).run()
    capsys.readouterr()
    resumed = TrainConfig(steps=8, resume=str(tmp_path / "ckpt-00000004.pt"), **base)
    make_trainer(resumed, DistContext.single()).run()
    assert "continuing at step 4; writing no checkpoints (a run resumed from a file writes them " \
           "only to a checkpoint_dir given)" in capsys.readouterr().err
    assert [p.name for p in sorted(tmp_path.glob("ckpt-*"))] == ["ckpt-00000002.pt", "ckpt-00000004.pt"]
    # given one, it writes there at the cadence of the run it continues, and says nothing more
    make_trainer(resumed.replace(checkpoint_dir=str(tmp_path / "b")), DistContext.single()).run()
    assert "writing no checkpoints" not in capsys.readouterr().err
    assert [p.name for p in sorted((tmp_path / "b").glob("ckpt-*"))] == \
        ["ckpt-00000006.pt", "ckpt-00000008.pt"]


def test_a_run_from_scratch_into_an_earlier_runs_checkpoints_warns(tmp_path, capsys):
    """Its checkpoints replace the earlier run's of the same steps: said before it trains, with
    the flag that continues that run instead; --resume never means it, and is quiet."""
    base = dict(**QUICK, steps=4, checkpoint_dir=str(tmp_path), checkpoint_every=2)
    make_trainer(TrainConfig(**base), DistContext.single()).run()
    assert "holds checkpoints" not in capsys.readouterr().err
    make_trainer(TrainConfig(**base), DistContext.single()).run()
    assert f"{tmp_path} holds checkpoints of an earlier run (steps 2 to 4); this run starts from " \
           f"scratch and replaces those of its own steps: give --resume {tmp_path} to continue " \
           "it, --resume never to say you mean this, or another --checkpoint-dir" \
           in capsys.readouterr().err
    make_trainer(TrainConfig(**base, resume="never"), DistContext.single()).run()
    assert "holds checkpoints" not in capsys.readouterr().err
