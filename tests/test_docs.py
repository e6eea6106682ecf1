"""The guide builds in strict mode (a broken page, link, reference, docstring or results table fails
it), and the module docstrings stay short: a rule and its reason, the numbers in the guide."""

import ast
import subprocess
import sys

import pytest
from conftest import ROOT, explain

DOCSTRING_LINES = 40


def test_no_module_docstring_is_over_40_lines():
    long = {}
    for path in sorted((ROOT / "downpour_lib").rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text()), clean=False)
        if doc and len(doc.splitlines()) > DOCSTRING_LINES:
            long[str(path.relative_to(ROOT))] = len(doc.splitlines())
    assert not long, f"module docstrings over {DOCSTRING_LINES} lines (move the tables to docs/): {long}"


@pytest.mark.slow
def test_the_guide_builds_in_strict_mode(tmp_path):
    """What `make docs` runs, into a temporary folder: every warning is an error."""
    pytest.importorskip("sphinx", reason="the docs extra (pip install -e .[docs]) is not installed")
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html",
                           str(ROOT / "docs"), str(tmp_path / "html")],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, explain(proc)
    html = (tmp_path / "html" / "mpi_backend.html").read_text()
    assert "generated at build time from" in html and "commit" in html, "the measured tables are missing"
