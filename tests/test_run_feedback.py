"""What a run tells its user: progress in a batch log."""

import io
import re

from conftest import BIN, explain, mpiexec

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
