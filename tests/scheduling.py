"""make test's scheduling: pytest-xdist's ``--dist loadgroup``, with one worker kept for the tests
that wait (``--waiting-worker``).

Some tests spend most of their time waiting, not computing: a stopped rank's timeout (20 s a test,
tests/test_silent_rank.py), a hung run's, a stopped engine's (tests/test_cluster.py). pytest-xdist
hands the groups out first, so on three workers these groups, the Slurm ones and the notebooks all
started at once, and for the first ten minutes of a fresh clone's run the two cores were 70-85%
busy while everything after was CPU-bound. Kept to a worker of their own, they wait beside three
workers that compute. The waiting worker takes no other test: four workers that compute made the
CPU-bound part longer (Makefile, beside TEST_WORKERS).

A test goes there when it is marked ``waits``; a group (``xdist_group``, a shared setup) goes
whole when any of its tests is (``conftest.in_groups`` names it ``waits:<group>``).
"""

from __future__ import annotations

from xdist.scheduler import LoadGroupScheduling

#: the group of the ``waits`` tests that share no other group; the prefix of those that do
WAITS = "waits"


def waiting_group(group: str | None) -> str:
    """The group name that sends ``group`` (None: a test of no group) to the waiting worker."""
    return WAITS if group is None else f"{WAITS}:{group}"


def waits(scope: str) -> bool:
    return scope == WAITS or scope.startswith(f"{WAITS}:")


class WaitingWorker(LoadGroupScheduling):
    """``loadgroup``, but one worker (the last one up) takes only the waiting groups and the others
    prefer everything else: they take a waiting group only when nothing else is left, or once the
    waiting worker is gone. The waiting worker stops when no waiting group is left."""

    def __init__(self, config, log=None) -> None:
        super().__init__(config, log)
        self.waiter = None

    def schedule(self) -> None:
        if self.collection is None and self.waiter is None and len(self.nodes) > 1:
            self.waiter = self.nodes[-1]
        super().schedule()

    def _next_scope(self, node) -> str | None:
        """The first queued group ``node`` should take, or None: nothing for it."""
        if node is self.waiter:
            return next((s for s in self.workqueue if waits(s)), None)
        preferred = (s for s in self.workqueue if not waits(s) or self.waiter not in self.nodes)
        return next(preferred, next(iter(self.workqueue), None))

    def _assign_work_unit(self, node) -> None:
        scope = self._next_scope(node)
        if scope is None:
            node.shutdown()
            return
        work_unit = self.workqueue.pop(scope)
        self.assigned_work.setdefault(node, {})[scope] = work_unit
        collection = self.registered_collections[node]
        node.send_runtest_some([collection.index(nodeid) for nodeid, done in work_unit.items()
                                if not done])

    def _reschedule(self, node) -> None:
        if node.shutting_down:
            return
        if self._next_scope(node) is None:
            node.shutdown()
            return
        if self._pending_of(self.assigned_work[node]) > 2:  # xdist's: keep two units ahead
            return
        self._assign_work_unit(node)
