"""The ``downpour`` console script's entry point: the early hold first, then the command line.

``downpour train`` holds its preemption signal and forks its start-up sentinel before torch is
imported (``_early``): the fork must happen while the process is one thread, and a signal during
the seconds of torch's import must be held, not fatal. So this module imports nothing heavy, and
``downpour_lib/__init__`` imports nothing eagerly: ``cli`` (and torch) come after the hold."""

import sys
from collections.abc import Sequence

from . import _early


def main(argv: Sequence[str] | None = None) -> int:
    _early.hold(list(sys.argv[1:] if argv is None else argv))
    from .cli import main as cli_main

    return cli_main(argv)
