"""Handles for asynchronous collectives, as TorchMPI's users had them: start now, ``wait()`` later.

A ``Handle`` wraps the backend's ``Work`` objects (one per collective it started) and an optional
finishing step that runs once, on the first ``wait()``: copying a flattened list back into its
tensors, dividing a sum into a mean, upcasting a compressed buffer. ``is_completed()`` polls without
blocking; for backends that only progress inside their own calls (MPI), polling is what moves them on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch.distributed as dist


class Handle:
    """One outstanding collective. ``wait()`` blocks until it is done and returns its result."""

    def __init__(self, works: Sequence[dist.Work] = (), finish: Callable[[], Any] | None = None,
                 result: Any = None) -> None:
        self._works = list(works)
        self._finish = finish
        self._result = result
        self._done = not self._works and finish is None

    @classmethod
    def completed(cls, result: Any = None) -> Handle:
        """A handle for work that needed no communication (a world or group of one)."""
        return cls(result=result)

    def is_completed(self) -> bool:
        """True once every underlying collective has finished (the finishing step may still be due)."""
        if self._done:
            return True
        return all(work.is_completed() for work in self._works)

    def wait(self) -> Any:
        """Block until the collective is done, finish it (once), and return its result.

        A failed collective (a peer died, the timeout passed) raises here, on every waiting rank.
        """
        if not self._done:
            for work in self._works:
                work.wait()
            self._works = []
            if self._finish is not None:
                finish, self._finish = self._finish, None
                out = finish()
                if out is not None:
                    self._result = out
            self._done = True
        return self._result
