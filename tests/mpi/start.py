"""``python tests/mpi/start.py SCRIPT ARGS...``: run a rank script as ``python SCRIPT ARGS...``
would, after importing torch the way ``downpour train`` does (``downpour_lib._torch_import``:
with Python's cyclic collector paused, a third less CPU a rank). ``conftest.mpi_python`` starts
every script of this directory so."""

import runpy
import sys

from downpour_lib._torch_import import import_torch

if __name__ == "__main__":
    import_torch()
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
