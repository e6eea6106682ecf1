"""Real multi-process runs: mpiexec (Open MPI) and torchrun, compared against references."""

import json
import sys
import time

from conftest import BIN, ROOT, explain, launch_env, mpi_python, mpiexec, read_json


def test_sync_ps_and_ddp_equal_one_process_on_the_n_times_batch():
    proc = mpi_python(3, "equivalence.py")
    assert proc.returncode == 0, explain(proc)
    cases = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [c["case"] for c in cases] == [
        "sync_ps dedicated, 2 workers", "sync_ps colocated, 3 workers", "ddp, 3 workers",
        "sync_ps dedicated, 2 workers, warm-up + step decay",
        "allreduce, 3 workers, warm-up + step decay, linear scaling"]
    for case in cases:
        assert case["ok_all_ranks"] and case["max_abs_diff"] < 1e-5, case
        assert case["reference_moved"] > 1e-2, case  # the comparison is not vacuous


def test_sync_ps_reaches_90_percent_on_digits(digits_runs):
    s = digits_runs["sync_ps"]
    assert s["test_accuracy"] >= 0.90, s
    assert (s["launcher"], s["world_size"], s["num_workers"], s["num_servers"]) == ("mpi", 4, 3, 1)
    n_params = 16 * 4 + 6 * 1 * 25 + 6 + 16 * 6 * 25 + 16 + 64 * 120 + 120 + 120 * 84 + 84 + 84 * 10 + 10
    # a worker sends one gradient and receives one parameter vector per step (float32)
    assert s["bytes_sent_per_step"] == s["bytes_received_per_step"] == 4 * (n_params - 16 * 4)


def test_ddp_under_torchrun_matches_ddp_under_mpiexec(tmp_path):
    args = ["train", "--algorithm", "ddp", "--model", "mlp", "--dataset", "digits", "--steps",
            "30", "--threads", "1", "--backend", "gloo"]
    import subprocess

    torchrun = subprocess.run(
        [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", "-m", "downpour_lib",
         *args, "--summary-json", str(tmp_path / "t.json")],
        env=launch_env(), capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert torchrun.returncode == 0, explain(torchrun)
    mpi = mpiexec(2, sys.executable, "-m", "downpour_lib", *args,
                  "--summary-json", str(tmp_path / "m.json"))
    assert mpi.returncode == 0, explain(mpi)
    t, m = read_json(tmp_path / "t.json"), read_json(tmp_path / "m.json")
    assert (t["launcher"], m["launcher"]) == ("torchrun", "mpi")
    assert t["world_size"] == m["world_size"] == 2
    # same seed, data and global batch: the same samples in the same order, the same training
    assert abs(t["final_train_loss"] - m["final_train_loss"]) < 1e-5
    assert t["test_accuracy"] == m["test_accuracy"]


def test_a_failing_rank_ends_the_job_and_is_named():
    start = time.monotonic()
    proc = mpi_python(3, "failing_rank.py", timeout=120)
    elapsed = time.monotonic() - start
    assert proc.returncode != 0, explain(proc)
    assert "rank 1 of 3 failed: RuntimeError: injected failure for the test" in proc.stderr
    assert elapsed < 60, f"took {elapsed:.0f} s"


def test_algorithm_that_cannot_run_on_this_world_fails_before_rendezvous():
    proc = mpiexec(2, str(BIN / "downpour"), "train", "--algorithm", "local", timeout=120)
    assert proc.returncode != 0
    assert proc.stderr.count("runs in one process, but this launch has 2 ranks") == 1, explain(proc)


def test_runtime_on_sub_worlds_of_one_mpi_job_one_job_after_another():
    proc = mpi_python(3, "subworld.py")
    assert proc.returncode == 0, explain(proc)
    seen = sorted((json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")),
                  key=lambda s: s["world_rank"])
    # [rank, world size, local rank, local world size, allreduce of rank + 1, backend]
    assert [s["job1"] for s in seen] == [[0, 2, 0, 2, 3.0, "gloo"], [1, 2, 1, 2, 3.0, "gloo"],
                                         [0, 1, 0, 1, 1.0, None]]
    assert [s["job2"] for s in seen] == [[r, 3, r, 3, 6.0, "gloo"] for r in range(3)]
