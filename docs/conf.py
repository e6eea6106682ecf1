"""The guide's Sphinx configuration: MyST markdown, the API from docstrings, strict by `make docs`."""

import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# autosummary's stubs are made again on every build: one left by a module that moved away would
# fail the strict build (make docs and tests/test_docs.py alike)
shutil.rmtree(HERE / "_generated" / "api", ignore_errors=True)
sys.path.insert(0, str(HERE / "_ext"))
sys.path.insert(0, str(HERE.parent))

project = "downpour"
author = "the downpour authors"
copyright = "the downpour authors"
extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.autosummary",
              "sphinx.ext.mathjax", "sphinx-mathjax-offline", "results"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}  # .rst: autosummary's stubs
exclude_patterns = ["_build", "README.md"]
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3
highlight_language = "none"  # the shell blocks are plain fences (tests/test_readme.py runs them)
html_theme = "furo"
html_title = "downpour"
html_static_path = []

# The API reference: every module's docstring and public members, generated (docs/api.md).
autosummary_generate = True
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": True,
                           "ignore-module-all": True}  # a re-export is documented where it is defined
autosummary_ignore_module_all = True
autosummary_imported_members = False
autodoc_typehints = "description"
autodoc_member_order = "bysource"
autodoc_mock_imports = []
# -n: every reference must resolve: pages, labels, and downpour_lib's own names. Names outside this
# project (torch, numpy, pandas, the standard library) have no inventory here (no network at build
# time), so a Python reference that does not name downpour_lib is let go.
nitpick_ignore_regex = [(r"py:.*", r"(?!downpour_lib\.).*")]
