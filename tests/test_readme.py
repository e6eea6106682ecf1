"""The README and the guide (docs/*.md) stay true: the loop diff runs on both sides (and the
distributed side keeps ranks in sync), and their commands are the ones an activated venv provides."""

import os
import re
import subprocess
import sys

import pytest
from conftest import BIN, ROOT, explain, mpiexec

ACTIVATE = "source .venv/bin/activate"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SAYS_ACTIVATE = {"README.md", "getting_started.md"}  # the pages a reader starts from

CHECKSUM = '\nprint("CHECKSUM", sum(float(p.double().sum()) for p in model.parameters()), flush=True)\n'


def readme_diff() -> list[str]:
    text = (ROOT / "docs" / "getting_started.md").read_text()
    block = re.search(r"tests/test_readme.py.*?```diff\n(.*?)```", text, re.S)
    assert block, "the tested diff block is missing from docs/getting_started.md"
    return block.group(1).splitlines()


def side(lines: list[str], drop: str) -> str:
    """One side of the diff: drop the other side's lines and the first column."""
    return "\n".join(line[1:] for line in lines if not line.startswith(drop)) + CHECKSUM


def test_plain_side_runs_in_one_process(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text(side(readme_diff(), drop="+"))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "CHECKSUM" in proc.stdout, explain(proc)
    assert "40 steps, last loss " in proc.stdout, explain(proc)  # what the reader sees of a run


def test_distributed_side_runs_under_mpiexec_and_keeps_ranks_identical(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(side(readme_diff(), drop="-"))
    proc = mpiexec(2, sys.executable, str(script), timeout=180)
    assert proc.returncode == 0, explain(proc)
    sums = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("CHECKSUM")]
    assert len(sums) == 2 and sums[0] == sums[1], proc.stdout
    assert proc.stdout.count("40 steps, last loss ") == 2, proc.stdout  # each rank's


def shell_blocks(page) -> list[tuple[int, str]]:
    """(offset, text) of every plain ``` block of a page: its shell commands."""
    text = page.read_text()
    return [(m.start(), m.group(1)) for m in re.finditer(r"```\n(.*?)```", text, re.S)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_pages_say_once_to_activate_the_venv_and_then_use_plain_commands(page):
    text = page.read_text()
    tools = re.compile(r"^(\S+ )*(downpour|mpiexec|ipcluster|torchrun|jupyter) ", re.M)
    if page.name in SAYS_ACTIVATE:
        assert text.count(ACTIVATE) == 1, f"{page.name}: say `{ACTIVATE}` once, near the top"
        first = min(at for at, block in shell_blocks(page) if tools.search(block))
        assert text.index(ACTIVATE) < first, f"{page.name}: the venv is activated after a command needs it"
    else:
        assert ACTIVATE not in text, f"{page.name}: getting_started.md says to activate the venv, once"
    for _, block in shell_blocks(page):
        wrong = [line for line in block.splitlines() if ".venv/bin/" in line and ACTIVATE not in line]
        assert not wrong, f"{page.name}: with the venv active, write the plain command: {wrong}"


def test_the_readme_is_a_front_page_with_both_commands_on_its_first_screen():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; the guide (docs/) holds the rest"
    first = "\n".join(lines[:30])
    assert "make study" in first and "make test" in first, "both commands within the first 30 lines"


def test_activating_the_venv_puts_the_readmes_tools_on_path():
    """What `source .venv/bin/activate` promises, checked on the venv the tests run in."""
    if not (BIN / "activate").exists():
        pytest.skip(f"{BIN} is not a venv (no bin/activate), e.g. a conda environment")
    clean = {"HOME": os.environ.get("HOME", "/"), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(["bash", "-c", f"source {BIN}/activate && command -v downpour mpiexec "
                           "ipcluster python"], env=clean, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, explain(proc)
    assert proc.stdout.split() == [str(BIN / t) for t in ("downpour", "mpiexec", "ipcluster", "python")]
