"""What ``pip install downpour`` (not the editable install the suite runs on) gets: every file the
library reads at run time. A wheel without the mpi backend's C sources built nothing and kept the
slower Python data phase without a word; one without the hardware presets fails ``model predict``."""

from __future__ import annotations

import shutil
import subprocess
import zipfile

from conftest import BIN, ROOT, explain


def test_the_wheel_carries_every_file_the_library_reads(tmp_path):
    tracked = subprocess.run(["git", "ls-files", "downpour_lib"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
    needed = {path for path in tracked if not path.endswith(".py")}
    assert {"downpour_lib/comm/mpi/native_calls.c", "downpour_lib/comm/mpi/native.h"} <= needed
    # built from a copy of the tracked files: setuptools writes build/ beside the sources
    source = tmp_path / "source"
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    for path in files:
        if (ROOT / path).is_file():
            (source / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / path, source / path)
    proc = subprocess.run([str(BIN / "uv"), "build", "--wheel", "-q", "-o", str(tmp_path / "dist"),
                           str(source)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, explain(proc)
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    assert needed <= names, f"left out of the wheel: {sorted(needed - names)}"
    assert {p for p in tracked if p.endswith(".py")} <= names
