"""``downpour`` for tests/test_preempt.py's signalled jobs: the console script, except that the
rank that writes checkpoint ``DOWNPOUR_TEST_HOLD_AT`` (the job's first start only) then waits for
the preemption signal before it trains on, so that a fast machine cannot finish the run before the
fixture's signal (sent once it sees that checkpoint) reaches it: the test waits for an event, not a
race. The fixture puts it first on the job's PATH as ``downpour``."""

import os
import sys
import time

from downpour_lib import _early

_early.hold(sys.argv[1:])  # what the `downpour` entry point does first (``console.main``)

from downpour_lib import checkpoint, preempt  # noqa: E402

HOLD_AT = int(os.environ["DOWNPOUR_TEST_HOLD_AT"])
HOLD_S = 300.0  # at most: a signal that never comes fails the test on its asserts, not by a hang
_save = checkpoint.save


def save(directory, state):
    path = _save(directory, state)
    if state["step"] == HOLD_AT and preempt.restarts() == 0:
        start = time.monotonic()
        while not preempt.SIGNAL.requested() and time.monotonic() < start + HOLD_S:
            time.sleep(0.01)
        print(f"downpour-test: held at checkpoint {HOLD_AT} for {time.monotonic() - start:.1f} s, "
              f"{'until the preemption signal' if preempt.SIGNAL.requested() else 'no signal'}",
              file=sys.stderr, flush=True)
    return path


checkpoint.save = save

from downpour_lib.cli import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
