"""Preemption on the real Slurm sandbox: cluster_profiles/launch_multinode.sbatch jobs signalled with
USR2 mid-run (`scancel --signal=USR2 --batch`, as Slurm's --signal=USR2@T or a preemption would),
checkpointed, requeued by the batch script (`scontrol requeue`, once the ranks' last words are in the
log) and resumed (`--resume auto`), to the end.

Four jobs run at once on the one node (they are small): sync_ps and allreduce must end with the
parameters of an uninterrupted run (1e-6), the allreduce one through a storm of signals across its
checkpoint write, which must leave every checkpoint loadable; Downpour, whose servers' shards are in
the checkpoint, must reach 0.90 on digits; a signal before the first step must start the requeued
run from scratch. Three more, on a sandbox of their own, meet SIGTERM and the time limit: a plain
`scancel` and the hard time limit of a job without --signal must leave a checkpoint of the step they
stopped at (exit 143, not requeued), and a --time not longer than the script's signal lead is
refused before any rank starts.
Slurm holds a requeued job for two minutes before it may start again; the test lets it start at
once (`scontrol update StartTime=now`), which changes nothing else.

The decisions themselves (who stops when, on which step) and resume auto are also checked without
Slurm, below, under mpiexec.
"""

import os
import re
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from conftest import BIN, explain, launch_env, mpiexec, mpiexec_path, read_json
from slurm_sandbox import BATCH, job_processes, job_state, running_sandbox, submit_batch

from downpour_lib import TrainConfig, checkpoint, preempt
from downpour_lib.errors import ConfigError
from downpour_lib.sandbox import slurm_conf

# signalled at the first checkpoint (100), where the rank that wrote it waits for the signal
# (``held_downpour``): a fast machine ran the 700 steps after it in under a second
SYNC_STEPS = 800
SYNC = ["--model=mlp", "--dataset=digits", f"--steps={SYNC_STEPS}", "--batch-size=16", "--threads=1",
        "--checkpoint-every=100", "--final-eval=false", "--backend=gloo"]
JOBS = {  # name: (ranks, flags)
    "sync_ps": (3, ["--algorithm=sync_ps", *SYNC]),
    "allreduce": (2, ["--algorithm=allreduce", *SYNC]),  # signalled by a storm
    # 20 epochs (440 steps): at 10 a fast machine ran all 220 in 4.1 s, and the job ended before
    # the signal sent at its checkpoint 50 reached it
    "downpour": (3, ["--algorithm=downpour", "--servers=1", "--model=lenet", "--dataset=digits",
                     "--epochs=20", "--threads=1", "--checkpoint-every=50"]),
    "early": (2, ["--algorithm=allreduce", "--model=mlp", "--dataset=digits", "--steps=200",
                  "--threads=1", "--final-eval=false"]),
}
REFERENCES = ("sync_ps", "allreduce")  # uninterrupted, under mpiexec, on the same backend
# the checkpoint at which each job's writing rank waits for the signal (``held_downpour``), the one
# the fixture signals at: the downpour job, too, could end before its signal reached it
HELD_AT = {"sync_ps": 100, "allreduce": 100, "downpour": 50}
# the jobs that run until Slurm stops them: their compute emulated (each step sleeps 20 ms), so the
# minute the time limit takes costs no CPU (it was a core's, beside the rest of make test)
LONG = ["--algorithm=allreduce", "--model=mlp", "--dataset=digits", "--steps=10000000", "--threads=1",
        "--final-eval=false", "--backend=gloo", "--compute=emulated", "--emulated-step-s=0.02"]
TERM_JOBS = {  # name: (ranks, flags, sbatch options); submitted first, so they start at once
    "scancel": (2, [*LONG, "--checkpoint-every=100"], []),  # a plain scancel after ckpt-100
    "timelimit": (1, LONG, ["--time=1"]),  # no --signal: the limit's TERM; no periodic checkpoint
    "short": (1, LONG, ["--time=1"]),  # the script's --signal=USR2@120 outlasts the limit: refused
}


def ckpt_dir(root: Path, name: str) -> Path:
    return root / f"{name}.ckpt"


def scancel_usr2(env, job: str) -> None:
    subprocess.run(["scancel", "--signal=USR2", "--batch", job], env=env, capture_output=True,
                   timeout=30)


def jobs_now(env) -> dict[str, dict[str, str]]:
    """Every job's fields (JobState, Restarts...) by job id, from one `scontrol show job`. One call
    a round, not one per job: at a load of 20 each took a second or more, and a job due for its
    signal waited for the round (downpour's came 150 of its then 220 steps after its checkpoint 50)."""
    out = subprocess.run(["scontrol", "show", "job", "-o"], env=env, capture_output=True, text=True,
                         timeout=30).stdout
    jobs = (dict(f.split("=", 1) for f in line.split() if "=" in f) for line in out.splitlines())
    return {fields["JobId"]: fields for fields in jobs if "JobId" in fields}


def requeued(fields: dict[str, str]) -> bool:
    return fields.get("JobState") == "PENDING" and fields.get("Restarts", "0") != "0"


def storm(job: str, stop: threading.Event) -> None:
    """USR2 to every rank of ``job`` every few milliseconds: some land during the checkpoint
    write, some during the vote, some after it."""
    while not stop.is_set():
        for pid in job_processes(job, ranks_only=True):
            try:
                os.kill(pid, signal.SIGUSR2)
            except ProcessLookupError:
                pass
        time.sleep(0.005)


@contextmanager
def cpus_for(ranks: int):
    """The sandbox's node advertises a CPU for each of ``ranks``, so that the jobs run at once: on
    its 8, the four jobs' 10 ranks did not fit, and each requeued job waited for a slot, 40-50 s in
    turn (slurmctld.log: its begin time set to now, its Allocate once another job had ended)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(slurm_conf, "MIN_CPUS", max(slurm_conf.MIN_CPUS, ranks))
        yield


def held_downpour(directory: Path) -> Path:
    """A directory whose ``downpour`` is tests/scripts/held_at_checkpoint.py: the console script,
    whose rank that writes the checkpoint named by DOWNPOUR_TEST_HOLD_AT waits there for the
    preemption signal. The synchronous jobs' 700 steps after their first checkpoint took under a
    second on a fast day, and a job could end before the signal the fixture sent on seeing that
    checkpoint reached it (one round of ``scontrol`` is a second or more under load); downpour's
    220 steps took 4.1 s."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "downpour"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).parent}/scripts/'
                      'held_at_checkpoint.py" "$@"\n')
    script.chmod(0o755)
    return directory


def held_at(held: Path, env: dict[str, str], step: int) -> dict[str, str]:
    """The job variables that run ``held_downpour``'s ``downpour``, held at checkpoint ``step``."""
    return {"PATH": f"{held}{os.pathsep}{env['PATH']}", "DOWNPOUR_TEST_HOLD_AT": str(step)}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Submit the four jobs, signal each at its moment, let each requeued one start at once;
    name -> (state, log, directory)."""
    root = tmp_path_factory.mktemp("preempt")
    references = {name: subprocess.Popen(
        [mpiexec_path(), "-n", str(JOBS[name][0]), "--oversubscribe", "--bind-to", "none",
         str(BIN / "downpour"),
         "train", *JOBS[name][1], "--checkpoint-dir", str(ckpt_dir(root / "reference", name))],
        env=launch_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for name in REFERENCES}
    held = held_downpour(root / "held")
    with cpus_for(sum(ranks for ranks, _ in JOBS.values())), running_sandbox(root / "slurm") as box:
        env = box.env(launch_env())
        ids = {name: submit_batch(env, root / f"{name}.out", 1, ranks,
                                  DOWNPOUR_ARGS=" ".join(flags),
                                  DOWNPOUR_CHECKPOINTS=str(ckpt_dir(root, name)),
                                  DOWNPOUR_SUMMARY=str(root / f"{name}.json"),
                                  **(held_at(held, env, HELD_AT[name]) if name in HELD_AT else {}))
               for name, (ranks, flags) in JOBS.items()}
        signalled: set[str] = set()
        hurried: set[str] = set()
        stop_storm = threading.Event()
        deadline = time.monotonic() + 600
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            now = jobs_now(env)
            for name, job in ids.items():
                if name not in signalled:
                    if name == "early":  # the ranks have just started: they are importing torch
                        due = len(job_processes(job, ranks_only=True)) == JOBS[name][0]
                        if due:
                            time.sleep(1.0)
                    else:
                        # its first periodic checkpoint, or a later one (older ones are pruned)
                        due = any(s >= HELD_AT[name] for s, _ in checkpoint.scan(ckpt_dir(root, name)))
                    if due:
                        signalled.add(name)
                        scancel_usr2(env, job)
                        if name == "allreduce":
                            threading.Thread(target=storm, args=(job, stop_storm), daemon=True).start()
                elif name not in hurried and requeued(now.get(job, {})):
                    if name == "allreduce":
                        stop_storm.set()
                    hurried.add(name)
                    time.sleep(1.0)  # the storm's last signals are spent
                    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], env=env,
                                   capture_output=True, timeout=30)
            states = {name: now.get(job, {}).get("JobState", "") for name, job in ids.items()}
            if all(s in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT") for s in states.values()):
                break
            time.sleep(0.05)
        stop_storm.set()
        for name, job in ids.items():  # whatever is left (a failed test) goes with the sandbox
            if states.get(name) not in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
                subprocess.run(["scancel", job], env=env, capture_output=True, timeout=30)
    for name, proc in references.items():
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"reference {name}:\n{out[-3000:]}"
    return {name: (states.get(name), (root / f"{name}.out").read_text(), root) for name in JOBS}


@pytest.fixture(scope="module")
def term_jobs(tmp_path_factory):
    """The three TERM_JOBS at once, on a sandbox of their own (the four above fill the node):
    scancel one after its first checkpoint, let the others meet their time limit;
    name -> (state, log, directory, exit code, restarts). About a minute and a half: Slurm's
    shortest limit is a minute, and it checks limits every half minute."""
    root = tmp_path_factory.mktemp("term")
    no_signal = root / "no_signal.sbatch"  # the script as a site's without --signal would be
    no_signal.write_text("".join(line for line in BATCH.read_text().splitlines(keepends=True)
                                 if not line.startswith("#SBATCH --signal")))
    with running_sandbox(root / "slurm") as box:
        env = box.env(launch_env())
        ids = {name: submit_batch(env, root / f"{name}.out", 1, ranks, *sbatch,
                                  script=no_signal if name == "timelimit" else BATCH,
                                  DOWNPOUR_ARGS=" ".join(flags),
                                  DOWNPOUR_CHECKPOINTS=str(ckpt_dir(root, name)),
                                  DOWNPOUR_SUMMARY=str(root / f"{name}.json"))
               for name, (ranks, flags, sbatch) in TERM_JOBS.items()}
        cancelled, deadline = False, time.monotonic() + 400
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            if not cancelled and checkpoint.scan(ckpt_dir(root, "scancel")):  # ckpt-100, or later
                subprocess.run(["scancel", ids["scancel"]], env=env, capture_output=True, timeout=30)
                cancelled = True
            states = {name: job_state(env, job) for name, job in ids.items()}
            if all(s in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT") for s in states.values()):
                break
            time.sleep(0.2)
        found = {name: (states.get(name), (root / f"{name}.out").read_text(), root,
                        job_field(env, job, "ExitCode"), job_field(env, job, "Restarts"))
                 for name, job in ids.items()}
        for name, job in ids.items():  # whatever is left (a failed test) goes with the sandbox
            if states.get(name) not in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
                subprocess.run(["scancel", job], env=env, capture_output=True, timeout=30)
    return found


def job_field(env, job: str, name: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", "-o", job], env=env, capture_output=True,
                         text=True, timeout=30).stdout
    return next((f.split("=", 1)[1] for f in out.split() if f.startswith(f"{name}=")), "")


def final_model(directory: Path, step: int) -> dict[str, torch.Tensor]:
    return checkpoint.load(checkpoint.checkpoint_path(directory, step))["model"]


def preempted_at(log: str) -> int:
    line = next(line for line in log.splitlines() if " preempted after " in line)
    return int(line.split(" preempted after ", 1)[1].split()[0])


def assert_requeued_and_resumed(name: str, state: str, log: str) -> int:
    assert state == "COMPLETED", f"{name}: {state}\n{log}"
    assert log.count("requeued Slurm job") == 1, log
    # the ranks' last words, then the script's, before the requeue ended the job's first start
    first = log.split("(start 1)", 1)[0]
    ranks, script = first.find(" preempted after "), first.find("downpour: preempted; the checkpoint is in ")
    assert 0 <= ranks < first.find("the batch script requeues the job") < script, log
    assert "(start 1)" in log and "downpour: summary in" in log, log
    completed = preempted_at(log)
    assert "resume auto: continuing from " in log and f"ckpt-{completed:08d}.pt" in log, log
    return completed


@pytest.mark.parametrize("name", REFERENCES)
def test_a_requeued_synchronous_run_ends_with_the_uninterrupted_parameters(jobs, name):
    state, log, root = jobs[name]
    completed = assert_requeued_and_resumed(name, state, log)
    assert 100 <= completed < SYNC_STEPS  # signalled after its first periodic checkpoint
    assert re.search(r"held at checkpoint 100 for [\d.]+ s, until the preemption signal", log), log
    resumed, reference = final_model(ckpt_dir(root, name), SYNC_STEPS), \
        final_model(ckpt_dir(root / "reference", name), SYNC_STEPS)
    diff = max((resumed[k] - reference[k]).abs().max().item() for k in reference)
    assert diff <= 1e-6, (name, diff)
    s = read_json(root / f"{name}.json")
    assert s["start_step"] == completed and s["total_steps"] == SYNC_STEPS


def test_a_requeued_downpour_run_resumes_its_servers_and_reaches_90_percent(jobs):
    state, log, root = jobs["downpour"]
    completed = assert_requeued_and_resumed("downpour", state, log)
    assert re.search(r"held at checkpoint 50 for [\d.]+ s, until the preemption signal", log), log
    ckpt = checkpoint.load(checkpoint.checkpoint_path(ckpt_dir(root, "downpour"), completed))
    assert not ckpt["final"] and ckpt["ranks"][0]["algorithm"]["version"] > 0  # server 0's shard
    s = read_json(root / "downpour.json")
    assert s["start_step"] == completed and s["test_accuracy"] >= 0.90, s


def test_signals_through_the_checkpoint_write_leave_every_checkpoint_loadable(jobs):
    """The allreduce job's signals came every few milliseconds until it left RUNNING: some in the
    vote, some in the write, some after it (its final parameters are checked above)."""
    state, log, root = jobs["allreduce"]
    completed = assert_requeued_and_resumed("allreduce", state, log)
    found = checkpoint.scan(ckpt_dir(root, "allreduce"))
    assert completed in [step for step, _ in found]
    for _, path in found:
        checkpoint.load(path)  # raises if torn
    assert not list(ckpt_dir(root, "allreduce").glob(".ckpt-*"))  # no temporary file left behind


def test_a_signal_before_the_first_step_starts_the_requeued_run_from_scratch(jobs):
    state, log, root = jobs["early"]
    assert state == "COMPLETED", log
    assert "preempted after 0 of 200 steps; no checkpoint (it stopped before its first step" in log
    assert "requeued Slurm job" in log
    assert f"resume auto: no checkpoint of this configuration in {ckpt_dir(root, 'early')}: " \
           "starting from scratch" in log, log
    assert read_json(root / "early.json")["start_step"] == 0


def stopped_by_term_at(name: str, term_jobs) -> int:
    """The step a SIGTERM stopped job ``name`` at, checked: its checkpoint is there and loads,
    the ranks and the script said so, it was not requeued, and resume auto continues from it."""
    from downpour_lib.data import load_dataset
    from downpour_lib.planning import plan_run

    state, log, root, exit_code, restarts = term_jobs[name]
    said = next((line for line in log.splitlines() if " stopped by SIGTERM after " in line), None)
    assert said is not None, f"{name}: {state}\n{log}"
    completed = int(said.split(" stopped by SIGTERM after ", 1)[1].split()[0])
    path = checkpoint.checkpoint_path(ckpt_dir(root, name), completed)
    assert f"checkpoint {path}" in said and checkpoint.load(path)["step"] == completed
    # the ranks' words, and the script's as the TERM came (its last ones, unless KillWait ran out)
    assert "not requeued: after a SIGTERM" in log and "downpour: SIGTERM (scancel, the time limit" in log, log
    assert restarts == "0" and "requeued Slurm job" not in log, log
    config = TrainConfig(algorithm="allreduce", model="mlp", dataset="digits", steps=10_000_000,
                         threads=1, final_eval=False, backend="gloo", compute="emulated",
                         emulated_step_s=0.02, checkpoint_dir=str(ckpt_dir(root, name)),
                         resume="auto")  # LONG's run
    plan = plan_run(config, TERM_JOBS[name][0], load_dataset("digits").train)
    assert plan.start_step == completed and plan.resume_path == str(path)
    return completed


def test_scancel_stops_the_run_at_a_step_with_its_checkpoint(term_jobs):
    """A plain scancel: TERM to every rank, KILL 5 s later (the sandbox's KillWait): the ranks
    stop at the next step, write a checkpoint past the periodic one, exit 143."""
    state, log, _, exit_code, _ = term_jobs["scancel"]
    assert state == "CANCELLED", log
    assert stopped_by_term_at("scancel", term_jobs) > 100  # what it trained since ckpt-100 is kept


def test_the_time_limit_without_a_signal_leaves_a_checkpoint(term_jobs):
    """A job without --signal at its time limit (1 minute): Slurm's TERM, then KILL after
    KillWait; the run had no periodic checkpoint, and leaves one of the step it stopped at."""
    state, log, root, exit_code, _ = term_jobs["timelimit"]
    assert state == "TIMEOUT", log
    if exit_code == "143:0":  # the script outlived KillWait (else its words came as the TERM did)
        assert "downpour: stopped by SIGTERM (scancel, the time limit, or a preemption); status 143" in log
    completed = stopped_by_term_at("timelimit", term_jobs)
    assert [s for s, _ in checkpoint.scan(ckpt_dir(root, "timelimit"))] == [completed]


def test_a_time_limit_not_longer_than_the_signal_lead_is_refused_before_any_rank_starts(term_jobs):
    state, log, root, exit_code, _ = term_jobs["short"]
    assert (state, exit_code) == ("FAILED", "2:0"), (state, exit_code, log)
    assert "downpour train: error: time limit='00:01:00' is not valid: this job has " in log, log
    assert "(--signal=USR2@120)" in log and "--time=00:12:00" in log, log
    assert "preempted" not in log and not ckpt_dir(root, "short").exists(), log


# -- without Slurm -------------------------------------------------------------------------------

def test_preempt_signal_and_resume_auto_are_checked():
    with pytest.raises(ConfigError, match="preempt_signal='KILL' is not valid: choose one of USR2"):
        TrainConfig(preempt_signal="KILL")
    with pytest.raises(ConfigError, match="resume='auto' is not valid: looks for checkpoints in "
                                          "checkpoint_dir"):
        TrainConfig(resume="auto")
    assert preempt.slurm_batch({"SLURM_JOB_ID": "7", "ENVIRONMENT": "BATCH"})
    assert not preempt.slurm_batch({"SLURM_JOB_ID": "7"})  # srun or salloc alone: no requeue


def test_resume_auto_takes_the_newest_checkpoint_of_this_configuration(tmp_path):
    from downpour_lib import train

    run = {"algorithm": "local", "model": "mlp", "dataset": "digits", "batch_size": 16,
           "checkpoint_dir": str(tmp_path), "checkpoint_every": 4}
    train(TrainConfig(**run, steps=8))
    # another configuration, newer files (ckpt-5, ckpt-10)
    train(TrainConfig(**{**run, "lr": 0.01, "checkpoint_every": 5}, steps=10))
    seen: list[str] = []
    from downpour_lib.data import load_dataset
    from downpour_lib.planning import plan_run

    digits = load_dataset("digits").train
    plan = plan_run(TrainConfig(**run, steps=12, resume="auto"), 1, digits, seen.append)
    assert plan.start_step == 8 and plan.resume_path == str(checkpoint.checkpoint_path(tmp_path, 8))
    assert any("another configuration (lr=0.01)" in line for line in seen), seen
    fresh = plan_run(TrainConfig(**{**run, "seed": 1}, steps=12, resume="auto"), 1, digits,
                     seen.append)
    assert fresh.start_step == 0 and seen[-1].endswith("starting from scratch")
    with pytest.raises(ConfigError, match="is this configuration's finished run \\(8 of 8 steps\\)"):
        plan_run(TrainConfig(**run, steps=8, resume="auto"), 1, digits, seen.append)


def rank_pid(marker: str, rank: int) -> int | None:
    """The process of MPI rank ``rank`` whose command line has ``marker``."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker.encode() in cmdline and f"OMPI_COMM_WORLD_RANK={rank}".encode() in environ:
            return int(pid)
    return None


@pytest.mark.slow  # 55-58 s each on CI
@pytest.mark.parametrize("algorithm, ranks, name", [("sync_ps", 3, "USR2"), ("sync_ps", 3, "TERM")])
def test_a_signal_to_one_rank_stops_every_rank_at_the_same_step(tmp_path, algorithm, ranks, name):
    """USR2 (TERM) to the last rank alone (a worker, not the rank that writes): the vote tells the
    others, all stop at one step (else they would hang in the next one), one checkpoint, exit 75
    (143, as torchrun and Lightning treat a TERM: scancel, a time limit). Not in Slurm, it says how
    to continue instead of requeueing; --resume auto continues to the end (after USR2; after TERM
    the checkpoint, written by the same stop, is read back whole: a second 3-rank run of 900 steps
    there cost 35 s of CPU and showed nothing USR2's does not). On the mpi backend (Slurm's tests:
    gloo). 400 steps: at ~50 a second here, seconds of margin after the first checkpoint."""
    flags = [f"--algorithm={algorithm}", "--model=mlp", "--dataset=digits", "--steps=400",
             "--threads=1", "--final-eval=false", "--checkpoint-dir", str(tmp_path),
             "--checkpoint-every=100"]
    env = launch_env()
    proc = subprocess.Popen([mpiexec_path(), "-n", str(ranks), "--oversubscribe", "--bind-to", "none",
                             str(BIN / "downpour"), "train", *flags], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = checkpoint.checkpoint_path(tmp_path, 100)
    deadline = time.monotonic() + 300
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(rank_pid(str(tmp_path), ranks - 1), getattr(signal, f"SIG{name}"))
    out, _ = proc.communicate(timeout=300)
    said = " stopped by SIGTERM after " if name == "TERM" else " preempted after "
    assert proc.returncode == (preempt.TERMINATED if name == "TERM" else preempt.PREEMPTED), out[-3000:]
    assert out.count(said) == 1, out[-3000:]  # rank 0 speaks for all
    completed = int(out.split(said, 1)[1].split()[0])
    assert completed >= 100  # after its first periodic checkpoint: what it wrote since is kept
    assert "run the same command again with --resume auto" in out
    if name == "TERM":
        assert "not requeued: after a SIGTERM" in out, out[-3000:]
    else:
        assert "requeue" not in out.replace("--resume auto", "")
    assert [s for s, _ in checkpoint.scan(tmp_path)][-1] == completed < 400
    if name == "TERM":
        state = checkpoint.load(checkpoint.checkpoint_path(tmp_path, completed))
        assert state["step"] == completed and not state["final"] and state["world_size"] == ranks
        assert len(state["ranks"]) == ranks, sorted(state)
        return
    resumed = mpiexec(ranks, str(BIN / "downpour"), "train", *flags, "--resume", "auto",
                      "--summary-json", str(tmp_path / "s.json"), timeout=300)
    assert resumed.returncode == 0, explain(resumed)
    assert read_json(tmp_path / "s.json")["start_step"] == completed


def test_the_early_hold_applies_to_downpour_train_alone():
    """Importing the library holds no signal in another program: USR2 keeps its default action."""
    code = "import signal, downpour_lib; print(signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL)"
    # the child starts with USR2's default whatever this process did: an ignored signal is inherited
    # across exec, and a run earlier in this process (StopSignal.ignore) leaves USR2 ignored
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          preexec_fn=lambda: signal.signal(signal.SIGUSR2, signal.SIG_DFL))
    assert proc.stdout.strip() == "True", explain(proc)


# A process whose handler is installed gets its signal again at each line run inside the handler
# for the one before, and inside what the handler calls (a trace function sends it), as a storm's
# would land; the handlers of those run at once, inside the interrupted one.
NESTED_SIGNALS = """
import os, signal, sys
from downpour_lib.preempt import StopSignal

stop = StopSignal()
assert stop.install("USR2")
sent = 0

def resignal(frame, event, arg):
    global sent
    if frame.f_code.co_name != "resignal" and sent < 200:
        sent += 1
        os.kill(os.getpid(), signal.SIGUSR2)
    return resignal

def trace(frame, event, arg):  # inside the handler, and whatever it calls, only
    while frame is not None and not frame.f_code.co_name.startswith("_handle"):
        frame = frame.f_back
    return resignal if frame is not None else None

sys.settrace(trace)
os.kill(os.getpid(), signal.SIGUSR2)
for _ in range(1000):  # the pending ones run here
    pass
sys.settrace(None)
print(sent, stop.requested())
"""


def test_a_signal_inside_the_handler_for_the_one_before_is_taken_too():
    """A storm of preemption signals (test_preempt's Slurm jobs get one every 5 ms) lands some
    inside the handler of the one before. A handler that took a lock (threading.Event.set) waited
    there for the lock its interrupted self held, forever, taking each further signal inside that
    wait, a stack level more each time, until the rank died of a RecursionError."""
    try:
        proc = subprocess.run([sys.executable, "-c", NESTED_SIGNALS], capture_output=True,
                              text=True, timeout=30, env=launch_env(),
                              preexec_fn=lambda: signal.signal(signal.SIGUSR2, signal.SIG_DFL))
    except subprocess.TimeoutExpired:
        pytest.fail("a signal inside the handler for the one before: the process hung")
    sent, requested = proc.stdout.split() if proc.returncode == 0 else ("0", "")
    assert int(sent) > 0 and requested == "True", explain(proc)


def test_a_requeued_start_that_makes_no_progress_is_not_requeued_again(tmp_path, monkeypatch, capsys):
    """A signal before the first step (as every start gets it when the time limit is not longer
    than the lead): on the job's first start the batch script is told to requeue (exit 75); on a
    restart that began at the same step it stopped at, it is not (exit 1, saying why)."""
    from downpour_lib.cli import main

    flags = ["train", "--algorithm", "local", "--model", "mlp", "--dataset", "digits", "--threads", "1",
             "--warmup-steps", "1", "--checkpoint-dir", str(tmp_path), "--checkpoint-every", "4"]
    assert main([*flags, "--steps", "4"]) == 0
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("ENVIRONMENT", "BATCH")
    monkeypatch.setenv("DOWNPOUR_BATCH_REQUEUES", "1")
    for restarts, status, said in ((0, preempt.PREEMPTED, "the batch script requeues the job"),
                                   (1, preempt.STALLED, "not requeued: this start (restart 1 of")):
        monkeypatch.setenv("SLURM_RESTART_COUNT", str(restarts))
        preempt.SIGNAL._handle(signal.SIGUSR2, None)  # came while it started
        capsys.readouterr()
        assert main([*flags, "--steps", "8"]) == status  # resume auto: the default in a Slurm job
        err = capsys.readouterr().err
        assert "resume auto: continuing from" in err and "preempted after 4 of 8 steps" in err, err
        assert said in err, err
    assert not preempt.SIGNAL.requested()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # given back after the run

