"""Checkpoints: atomic writes (a writer killed mid-write for real), weights_only loading, resuming
equal to not stopping, refusals that say why, and the evaluator skipping bad files."""

import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import ROOT, explain, launch_env, mpiexec, read_json

from downpour_lib import TrainConfig, Trainer, checkpoint, make_trainer, plan_run
from downpour_lib.comm.runtime import DistContext
from downpour_lib.data import load_dataset
from downpour_lib.errors import CheckpointError, ConfigError
from downpour_lib.evaluator import Evaluator

FAST = dict(model="mlp", dataset="digits", threads=1, seed=2, warmup_steps=1)


def params(trainer):
    return [p.detach().clone() for p in trainer.model.parameters()]


def train(**changes):
    trainer = make_trainer(TrainConfig(**{**FAST, **changes}), DistContext.single())
    return trainer, trainer.run()


@pytest.mark.parametrize("algorithm, optimizer", [("local", "sgd"), ("local", "adam"),
                                                  ("sync_ps", "sgd"), ("downpour", "adagrad")])
def test_resumed_run_ends_where_the_uninterrupted_one_does(tmp_path, algorithm, optimizer):
    full, _ = train(algorithm=algorithm, optimizer=optimizer, steps=30)
    train(algorithm=algorithm, optimizer=optimizer, steps=20, checkpoint_dir=str(tmp_path),
          checkpoint_every=7)
    assert [s for s, _ in checkpoint.scan(tmp_path)] == [7, 14, 20]
    resumed, result = train(algorithm=algorithm, optimizer=optimizer, steps=30,
                            resume=str(tmp_path))
    assert result.summary["start_step"] == 20 and list(result.steps.step) == list(range(20, 30))
    for a, b in zip(params(full), params(resumed), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # the resumed run went on checkpointing where it was; its last checkpoint is final
    state = checkpoint.load(checkpoint.latest(tmp_path))
    assert (state["step"], state["final"]) == (30, True)
    # an every-K checkpoint resumes as well as the final one
    again, _ = train(algorithm=algorithm, optimizer=optimizer, steps=30,
                     resume=str(tmp_path / "ckpt-00000014.pt"), checkpoint_dir=str(tmp_path / "b"))
    for a, b in zip(params(full), params(again), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


class Stop(Exception):
    pass


def stop_at(step):
    def callback(record):
        if record.step == step:
            raise Stop(step)
    return callback


def test_resumed_run_keeps_the_checkpoint_cadence(tmp_path):
    from downpour_lib.cli import main

    config = TrainConfig(**FAST, algorithm="local", steps=20, checkpoint_dir=str(tmp_path),
                         checkpoint_every=5)
    with pytest.raises(Stop):  # the run dies in its 11th step, after its checkpoint at 10
        make_trainer(config, DistContext.single(), callbacks=[stop_at(10)]).run()
    assert [s for s, _ in checkpoint.scan(tmp_path)] == [5, 10]
    # resumed as the README shows it, without repeating --checkpoint-every
    assert main(["train", "--algorithm", "local", "--model", "mlp", "--dataset", "digits",
                 "--seed", "2", "--threads", "1", "--warmup-steps", "1", "--steps", "20",
                 "--resume", str(tmp_path)]) == 0
    assert [s for s, _ in checkpoint.scan(tmp_path)] == [5, 10, 15, 20]
    # its checkpoints pass the cadence on to the next resume
    assert checkpoint.load(checkpoint.checkpoint_path(tmp_path, 15))["config"]["checkpoint_every"] == 5
    # a cadence given to the resumed run wins, 0 included
    ten = str(checkpoint.checkpoint_path(tmp_path, 10))
    for every, expected in ((None, [15, 20]), (4, [12, 16, 20]), (0, [20])):
        out = tmp_path / f"every-{every}"
        train(algorithm="local", steps=20, resume=ten, checkpoint_dir=str(out),
              checkpoint_every=every)
        assert [s for s, _ in checkpoint.scan(out)] == expected, every
    # a resumed run that writes no checkpoints has no cadence to keep
    trainer, _ = train(algorithm="local", steps=20, resume=ten)
    assert trainer.config.outputs.checkpoint_every == 0


def test_checkpoint_contents_load_with_weights_only(tmp_path):
    trainer, result = train(algorithm="local", steps=6, checkpoint_dir=str(tmp_path))
    path = checkpoint.checkpoint_path(tmp_path, 6)
    state = torch.load(path, weights_only=True)
    assert state["format"] == checkpoint.FORMAT and state["final"] and state["world_size"] == 1
    assert state["config"]["model"] == "mlp" and state["step"] == 6
    entry = state["ranks"][0]
    assert set(entry) == {"optimizer", "algorithm", "rng"}  # its model is the top-level one
    for k, v in trainer.model.state_dict().items():
        assert torch.equal(state["model"][k], v)
    assert entry["optimizer"]["state"]  # momentum buffers


def test_resume_refuses_another_run_or_world(tmp_path):
    train(algorithm="local", steps=6, checkpoint_dir=str(tmp_path))
    digits = load_dataset("digits").train
    cases = [(dict(algorithm="local", steps=9, model="lenet"), "model", "written with model='mlp'"),
             (dict(algorithm="local", steps=9, batch_size=8), "batch_size", "batch_size=32"),
             (dict(algorithm="local", steps=6), "resume", "already trained 6 of the 6 steps"),
             (dict(algorithm="local", steps=9, resume=str(tmp_path / "none")), "resume",
              "no such file or directory")]
    for changes, field, hint in cases:
        config = TrainConfig(**{**FAST, "resume": str(tmp_path), **changes})
        with pytest.raises(ConfigError) as err:
            plan_run(config, 1, digits)
        assert err.value.field == field and hint in str(err.value), err.value
    config = TrainConfig(**{**FAST, "algorithm": "sync_ps", "steps": 9, "resume": str(tmp_path)})
    with pytest.raises(ConfigError, match="written with algorithm='local'"):
        plan_run(config, 1, digits)
    with pytest.raises(ConfigError, match="checkpoint_dir too"):
        TrainConfig(checkpoint_every=5)


def test_resume_keeps_what_fields_declare_keep_and_auto_matches_on_match(tmp_path, capsys):
    """lr declares ``match``: a resume that names the checkpoint may lower it, resume auto does
    not take another lr's checkpoint; threads declares ``measure``: auto resumes across it."""
    train(algorithm="local", steps=6, lr=0.1, checkpoint_dir=str(tmp_path))
    digits = load_dataset("digits").train
    named = TrainConfig(**{**FAST, "algorithm": "local", "steps": 9, "lr": 0.02,
                           "resume": str(tmp_path)})
    assert plan_run(named, 1, digits).start_step == 6
    seen = []
    auto = dict(FAST, algorithm="local", steps=9, checkpoint_dir=str(tmp_path), resume="auto")
    assert plan_run(TrainConfig(**{**auto, "lr": 0.02}), 1, digits, seen.append).start_step == 0
    assert any("another configuration (lr=0.1)" in line for line in seen), seen
    assert plan_run(TrainConfig(**{**auto, "lr": 0.1, "threads": 2}), 1, digits).start_step == 6


@contextmanager
def stalled_writer(directory):
    """A real run whose checkpoint at step 10 stops halfway through its write; yields the process
    and its STALLED line (temporary file, full size). Killed on leaving, if it still runs."""
    script = Path(__file__).parent / "scripts" / "stalled_writer.py"
    proc = subprocess.Popen([sys.executable, str(script), str(directory)], stdout=subprocess.PIPE,
                            text=True, env=launch_env(), cwd=ROOT)
    try:
        line = proc.stdout.readline()  # blocks until the second write is half done
        assert line.startswith("STALLED"), line
        yield proc, line
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        proc.stdout.close()


def test_writer_killed_mid_write_leaves_the_previous_checkpoint(tmp_path):
    with stalled_writer(tmp_path) as (proc, line):
        proc.send_signal(signal.SIGKILL)  # a real kill, in the middle of the write
        proc.wait(timeout=30)
    _, temp, full_size = line.split()
    temp = Path(temp)
    # the half-written bytes are there, under a temporary name no reader looks at
    assert temp.exists() and 0 < temp.stat().st_size < int(full_size)
    assert temp.name.startswith(".ckpt-00000010.pt.")
    assert [s for s, _ in checkpoint.scan(tmp_path)] == [5]
    assert checkpoint.latest(tmp_path) == checkpoint.checkpoint_path(tmp_path, 5)
    assert checkpoint.load(checkpoint.latest(tmp_path))["step"] == 5
    # the run can be continued from it
    digits = load_dataset("digits").train
    plan = plan_run(TrainConfig(algorithm="local", model="mlp", steps=10, warmup_steps=1,
                                resume=str(tmp_path)), 1, digits)
    assert plan.start_step == 5


def test_next_save_removes_only_a_killed_writers_temporary_file(tmp_path):
    with stalled_writer(tmp_path) as (proc, line):
        temp = Path(line.split()[1])
        # the writer is alive, in the middle of its write: a save beside it leaves its file alone
        five = checkpoint.checkpoint_path(tmp_path, 5)
        checkpoint.save(tmp_path, checkpoint.load(five))
        assert temp.exists() and checkpoint.load(five)["step"] == 5
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    # other writers' temporary files and names that only look like ours are not ours to delete
    others = [tmp_path / ".evals.csv.k2j4x9_q.tmp", tmp_path / ".steps.csv.abc12345.tmp",
              tmp_path / "ckpt-00000010.pt.abc12345.tmp", tmp_path / ".ckpt-00000010.pt.tmp",
              tmp_path / "notes.tmp"]
    for other in others:
        other.write_bytes(b"x")
    assert temp.exists()  # the dead writer's file stays until the next save...
    trainer = make_trainer(TrainConfig(algorithm="local", model="mlp", steps=10, warmup_steps=1,
                                       threads=1, resume=str(tmp_path)), DistContext.single())
    assert trainer.start_step == 5
    trainer.run()
    assert not temp.exists()  # ...which deletes it
    assert all(other.exists() for other in others)
    assert [s for s, _ in checkpoint.scan(tmp_path)] == [5, 10]
    assert checkpoint.load(checkpoint.checkpoint_path(tmp_path, 10))["final"]


def test_torn_and_foreign_files_are_reported_and_skipped(tmp_path):
    _, result = train(algorithm="local", steps=12, checkpoint_dir=str(tmp_path), checkpoint_every=4)
    whole = checkpoint.checkpoint_path(tmp_path, 8).read_bytes()
    checkpoint.checkpoint_path(tmp_path, 9).write_bytes(whole[: len(whole) // 2])  # torn
    checkpoint.checkpoint_path(tmp_path, 10).write_bytes(b"not a checkpoint")
    torch.save({"weights": torch.zeros(2)}, checkpoint.checkpoint_path(tmp_path, 11))  # foreign
    for step in (9, 10, 11):
        with pytest.raises(CheckpointError):
            checkpoint.load(checkpoint.checkpoint_path(tmp_path, step))
    reports, log = [], []
    evaluator = Evaluator(tmp_path, tmp_path / "evals.csv", log=log.append, report=reports.append)
    assert evaluator.watch(poll_s=0.01, timeout_s=30) == "final before"  # a finished run's
    assert len(reports) == 3 and all(r.startswith("skipping") for r in reports), reports
    evals = pd.read_csv(tmp_path / "evals.csv")
    assert list(evals.step) == [4, 8, 12] and list(evals.final) == [False, False, True]
    assert evals.accuracy.iloc[-1] == result.summary["test_accuracy"]  # the same final model
    assert (evals.time_s.diff().dropna() > 0).all()
    # a second evaluator over the same CSV scores nothing again, and reports the bad files once
    again = Evaluator(tmp_path, tmp_path / "evals.csv", log=log.append, report=reports.append)
    assert again.poll() == 0 and again.poll() == 0 and len(reports) == 6
    # the newest readable checkpoint is what a resumed run starts from
    assert checkpoint.latest(tmp_path) == checkpoint.checkpoint_path(tmp_path, 12)


def test_the_evaluator_scores_the_samples_a_run_evaluates(tmp_path):
    """--samples N scores N samples spread over the test split, the ones a run's eval_samples=N
    reads: the final checkpoint scores what the run's own final evaluation did."""
    _, result = train(algorithm="local", steps=6, checkpoint_dir=str(tmp_path), eval_samples=90)
    evaluator = Evaluator(tmp_path, tmp_path / "evals.csv", samples=90, log=print, report=print)
    assert evaluator.poll() == 1
    evals = pd.read_csv(tmp_path / "evals.csv")
    assert evals.samples.tolist() == [90] and evals.final.tolist() == [True]
    assert evals.accuracy.iloc[-1] == result.summary["test_accuracy"]
    assert evals.loss.iloc[-1] == pytest.approx(result.summary["test_loss"], rel=1e-6)
    assert result.summary["test_accuracy"] != train(algorithm="local", steps=6)[1].summary["test_accuracy"]


def tear(path):
    """Cut ``path`` in half, as a disk that filled up or a copy that stopped would."""
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])


RESUME = ["train", "--algorithm", "sync_ps", "--model", "mlp", "--dataset", "digits", "--seed", "2",
          "--threads", "1", "--warmup-steps", "1"]


def test_resume_warns_that_it_skips_a_torn_newest_checkpoint(tmp_path, capsys):
    from downpour_lib.cli import main

    train(algorithm="sync_ps", steps=12, checkpoint_dir=str(tmp_path), checkpoint_every=4)
    newest, eight = checkpoint.checkpoint_path(tmp_path, 12), checkpoint.checkpoint_path(tmp_path, 8)
    tear(newest)
    capsys.readouterr()
    out = tmp_path / "summary.json"
    assert main([*RESUME, "--steps", "16", "--resume", str(tmp_path), "--summary-json", str(out)]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"downpour train: warning: skipping {newest}: unreadable (")
    assert warnings[0].endswith(f"; resuming from {eight}"), warnings[0]
    assert read_json(out)["start_step"] == 8
    # the resumed run wrote step 12 again, whole this time
    assert [s for s, _ in checkpoint.scan(tmp_path)] == [4, 8, 12, 16]
    assert checkpoint.load(newest)["step"] == 12


def test_resume_under_mpiexec_warns_once(tmp_path):
    first = mpiexec(2, sys.executable, "-m", "downpour_lib", *RESUME, "--steps", "8",
                    "--checkpoint-dir", str(tmp_path), "--checkpoint-every", "4")
    assert first.returncode == 0, explain(first)
    tear(checkpoint.checkpoint_path(tmp_path, 8))
    resumed = mpiexec(2, sys.executable, "-m", "downpour_lib", *RESUME, "--steps", "12",
                      "--resume", str(tmp_path))
    assert resumed.returncode == 0, explain(resumed)
    output = resumed.stdout + resumed.stderr
    assert output.count("warning: skipping") == 1, explain(resumed)
    assert f"resuming from {checkpoint.checkpoint_path(tmp_path, 4)}" in output


def test_watch_stops_at_until_step_or_timeout(tmp_path):
    empty = Evaluator(tmp_path / "nothing-yet", tmp_path / "e.csv", log=print, report=print)
    assert empty.watch(poll_s=0.01, timeout_s=0.2) == "timeout"
    train(algorithm="local", steps=9, checkpoint_dir=str(tmp_path / "run"), checkpoint_every=3)
    checkpoint.checkpoint_path(tmp_path / "run", 9).unlink()  # as if the run were still going
    evaluator = Evaluator(tmp_path / "run", tmp_path / "f.csv", log=print, report=print)
    assert evaluator.watch(poll_s=0.01, until_step=5) == "until_step"
    assert evaluator.scored == {3, 6}  # one poll scores everything present


def test_a_watch_goes_on_past_the_final_checkpoint_a_resumed_run_continues(tmp_path):
    """A run resumed from its final checkpoint writes newer ones beside it: the old final ends a
    watch begun before the resume (said: "final before"), not one begun after it."""
    import threading

    run = tmp_path / "run"
    train(algorithm="local", steps=6, checkpoint_dir=str(run), checkpoint_every=3)
    evaluator = Evaluator(run, tmp_path / "e.csv", log=print, report=print)
    assert evaluator.watch(poll_s=0.01, timeout_s=30) == "final before"
    train(algorithm="local", steps=12, resume=str(run))  # ckpt 9, then the final 12
    twelve, away = checkpoint.checkpoint_path(run, 12), tmp_path / "12.pt"
    twelve.rename(away)  # as if the resumed run were still going
    assert evaluator.watch(poll_s=0.01, timeout_s=0.3) == "timeout"  # step 6's final ended it
    assert evaluator.scored == {3, 6, 9}
    threading.Timer(0.2, away.rename, (twelve,)).start()  # the resumed run's last checkpoint
    assert evaluator.watch(poll_s=0.01, timeout_s=30) == "final"
    assert evaluator.scored == {3, 6, 9, 12}
    # seconds of training go on across the resume: a time-to-accuracy curve never runs backwards
    times = [r["time_s"] for r in sorted(evaluator.rows, key=lambda r: r["step"])]
    assert all(b > a for a, b in zip(times, times[1:], strict=False)), times


@pytest.mark.parametrize("args, expected", [
    (["--checkpoint-dir", "/nonexistent/run"], "checkpoint_dir='/nonexistent/run' is not valid"),
    (["--checkpoint-dir", ".", "--watch", "--poll-s", "0"], "poll_s=0.0 is not valid"),
    (["--checkpoint-dir", ".", "--watch", "--poll-s", "inf"], "poll_s=inf is not valid: must be a finite"),
    (["--checkpoint-dir", ".", "--watch", "--timeout-s", "nan"], "timeout_s=nan is not valid"),
    (["--checkpoint-dir", ".", "--until-step", "5"], "only apply with --watch"),
    (["--checkpoint-dir", ".", "--samples", "-1"], "samples=-1 is not valid: a whole number >= 0"),
])
def test_evaluate_cli_refuses_bad_input(capsys, args, expected):
    from downpour_lib.cli import main

    assert main(["evaluate", *args]) == 2
    assert expected in capsys.readouterr().err


def test_evaluate_refuses_a_csv_it_did_not_write_and_leaves_it_alone(tmp_path, capsys):
    """--csv names a file it continues: a run's own evals.csv, a JSON file, an empty file or another
    table is refused in one line (exit 2), not a traceback, and is not overwritten."""
    from downpour_lib.cli import main

    _, result = train(algorithm="local", steps=4, checkpoint_dir=str(tmp_path / "ck"),
                      output_dir=str(tmp_path / "out"))
    others = {tmp_path / "out" / "evals.csv": "no final column",
              # JSON parses as a CSV of one column, or not at all, as its commas fall
              tmp_path / "out" / "summary.json": "give a new file, or one `downpour evaluate` wrote",
              tmp_path / "empty.csv": "cannot be read as a CSV", tmp_path / "other.csv": "no step"}
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "other.csv").write_text("a,b\n")
    for csv, why in others.items():
        before = csv.read_bytes()
        assert main(["evaluate", "--checkpoint-dir", str(tmp_path / "ck"), "--csv", str(csv)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"csv='{csv}' is not valid: " in err and why in err, err
        assert csv.read_bytes() == before


def test_only_the_newest_periodic_checkpoints_are_kept_and_none_is_ever_torn(tmp_path):
    """keep_checkpoints=2: after every step every checkpoint file in the directory loads, the newest
    written is there, and at most two periodic ones are; at the end the two newest and the final
    remain. Another configuration's checkpoints and an earlier run's final one are left alone."""
    # another configuration (periodic 5, final 7), and this configuration's finished run (3)
    train(algorithm="local", steps=7, lr=0.01, checkpoint_dir=str(tmp_path), checkpoint_every=5)
    train(algorithm="local", steps=3, checkpoint_dir=str(tmp_path))
    seen = []

    def check(record):
        found = checkpoint.scan(tmp_path)
        states = {step: checkpoint.load(path) for step, path in found}  # raises if one is torn
        periodic = [s for s, st in states.items() if not st["final"] and st["config"]["lr"] != 0.01]
        assert len(periodic) <= 2, periodic
        if record.step >= 2:  # its first checkpoint (after step 2) was written at step index 1
            assert max(periodic) == (record.step // 2) * 2, (record.step, periodic)
        assert not list(tmp_path.glob(".ckpt-*"))  # no temporary file left behind
        seen.append(periodic)

    config = TrainConfig(**{**FAST, "algorithm": "local", "steps": 20, "checkpoint_dir": str(tmp_path),
                            "checkpoint_every": 2, "keep_checkpoints": 2})
    make_trainer(config, DistContext.single(), callbacks=[check]).run()
    assert [s for s, _ in checkpoint.scan(tmp_path)] == [3, 5, 7, 16, 18, 20]
    assert checkpoint.load(checkpoint.checkpoint_path(tmp_path, 5))["config"]["lr"] == 0.01
    assert checkpoint.load(checkpoint.checkpoint_path(tmp_path, 3))["final"]
    assert [2, 4] in seen and [4, 6] in seen  # pruned as it went, not only at the end


def test_the_checkpoint_a_run_resumed_from_is_never_pruned(tmp_path):
    train(algorithm="local", steps=12, checkpoint_dir=str(tmp_path / "a"), checkpoint_every=2)
    assert [s for s, _ in checkpoint.scan(tmp_path / "a")] == [6, 8, 10, 12]  # default: keep 3
    eight = checkpoint.checkpoint_path(tmp_path / "a", 8)
    train(algorithm="local", steps=20, resume=str(eight), checkpoint_dir=str(tmp_path / "a"),
          checkpoint_every=2, keep_checkpoints=1)
    # every periodic one but the newest goes (12 too, no longer the final one once the run went
    # past it), except 8: the one it resumed from
    assert [s for s, _ in checkpoint.scan(tmp_path / "a")] == [8, 18, 20]


def test_keep_checkpoints_and_resume_never_are_checked_and_documented(tmp_path, capsys):
    from downpour_lib.cli import main

    with pytest.raises(ConfigError, match="keep_checkpoints=0 is not valid: must be a whole number >= 1"):
        TrainConfig(keep_checkpoints=0)
    flags = ["train", "--algorithm", "local", "--model", "mlp", "--dataset", "digits", "--threads", "1",
             "--warmup-steps", "1", "--steps", "4", "--checkpoint-dir", str(tmp_path)]
    assert main([*flags, "--keep-checkpoints", "-1"]) == 2
    assert "keep_checkpoints=-1 is not valid" in capsys.readouterr().err
    assert main(flags) == 0
    # the same again finds its finished run in the pre-flight, exit 2, and says the ways on
    capsys.readouterr()
    assert main([*flags, "--resume", "auto", "--preflight"]) == 2
    err = capsys.readouterr().err
    assert "is this configuration's finished run (4 of 4 steps)" in err, err
    assert "another --job-name or DOWNPOUR_CHECKPOINTS" in err and "--resume never" in err, err
    assert main([*flags, "--resume", "never", "--preflight"]) == 0
    assert main([*flags, "--resume", "never", "--summary-json", str(tmp_path / "s.json")]) == 0
    assert read_json(tmp_path / "s.json")["start_step"] == 0  # from scratch, in the same directory


def test_engines_resume_auto_from_the_clients_plan_as_a_full_preflight_would(tmp_path, monkeypatch):
    """A cluster's client plans once; engines in a Slurm job (resume=auto by the job's rule)
    redo only where the run starts (plan_resume), and land where a whole plan_run lands."""
    from downpour_lib.planning import plan_resume

    run = dict(algorithm="local", model="mlp", warmup_steps=1, threads=1, preempt_signal="none",
               checkpoint_dir=str(tmp_path))
    make_trainer(TrainConfig(**run, steps=4, checkpoint_every=2), DistContext.single()).run()
    digits = load_dataset("digits").train
    client = TrainConfig(**run, steps=6)  # the notebook's call: no resume named
    plan = plan_run(client, 1, digits)
    assert plan.start_step == 0 and plan.resume_path is None
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    engines = client.slurm_resume()
    assert engines.outputs.resume == "auto"
    said: list[str] = []
    resumed = plan_resume(engines, plan, 1, said.append)
    assert resumed == plan_run(engines, 1, digits, lambda _: None)
    assert resumed.start_step == 4 and resumed.resume_path == str(checkpoint.checkpoint_path(tmp_path, 4))
    assert said and "continuing from" in said[-1]
    trainer = Trainer(engines, DistContext.single(), resumed)  # the plan given: none made
    assert trainer.start_step == 4 and trainer.run().summary["start_step"] == 4
