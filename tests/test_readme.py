"""The README's loop diff stays true: both sides run, and the distributed side keeps ranks in sync."""

import re
import sys

from conftest import ROOT, explain, mpiexec

CHECKSUM = '\nprint("CHECKSUM", sum(float(p.double().sum()) for p in model.parameters()), flush=True)\n'


def readme_diff() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"tests/test_readme.py.*?```diff\n(.*?)```", text, re.S)
    assert block, "the tested diff block is missing from README.md"
    return block.group(1).splitlines()


def side(lines: list[str], drop: str) -> str:
    """One side of the diff: drop the other side's lines and the first column."""
    return "\n".join(line[1:] for line in lines if not line.startswith(drop)) + CHECKSUM


def test_plain_side_runs_in_one_process(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text(side(readme_diff(), drop="+"))
    import subprocess

    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "CHECKSUM" in proc.stdout, explain(proc)


def test_distributed_side_runs_under_mpiexec_and_keeps_ranks_identical(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(side(readme_diff(), drop="-"))
    proc = mpiexec(2, sys.executable, str(script), timeout=180)
    assert proc.returncode == 0, explain(proc)
    sums = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("CHECKSUM")]
    assert len(sums) == 2 and sums[0] == sums[1], proc.stdout
