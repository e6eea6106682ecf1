"""``python -m downpour_lib``: the console script's entry point (``console``), early hold included,
so that ranks launched this way (the studies', ``bench train``'s) hold their preemption signal and
fork their start-up sentinel before torch is imported, as ``downpour train``'s do."""

from .console import main

raise SystemExit(main())
