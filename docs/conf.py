"""The guide's Sphinx configuration: MyST markdown, the API from docstrings, strict by `make docs`."""

import importlib
import pkgutil
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))
sys.path.insert(0, str(HERE.parent))


def write_api_pages(folder: Path) -> None:
    """The API reference (docs/api.md): a page for each public module or package at the top of
    downpour_lib, with every public module under it a section of that page (its docstring and
    public members, by autodoc). Made again on every build: a page left by a module that moved
    away would fail the strict build. One page per module (autosummary's, 168 of them) made every
    page of the guide copy the navigation tree of them all: a third of the build's time."""
    import downpour_lib

    def public(modules):
        return [m.name for m in modules if not any(p.startswith("_") for p in m.name.split("."))]

    def section(level: str, name: str) -> str:
        return f"{level} {name}\n\n```{{eval-rst}}\n.. automodule:: {name}\n```\n"

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for top in public(pkgutil.iter_modules(downpour_lib.__path__, "downpour_lib.")):
        package = importlib.import_module(top)
        below = sorted(public(pkgutil.walk_packages(package.__path__, top + "."))
                       if hasattr(package, "__path__") else [])
        page = [section("#", top)] + [section("\n##", name) for name in below]
        (folder / f"{top}.md").write_text("".join(page))


write_api_pages(HERE / "_generated" / "api")

project = "downpour"
author = "the downpour authors"
copyright = "the downpour authors"
extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.mathjax", "sphinx-mathjax-offline",
              "results"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "README.md"]
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3
highlight_language = "none"  # the shell blocks are plain fences (tests/test_readme.py runs them)
html_theme = "furo"
html_title = "downpour"
html_static_path = []

# The API reference: every module's docstring and public members (write_api_pages, docs/api.md).
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": True,
                           "ignore-module-all": True}  # a re-export is documented where it is defined
autodoc_typehints = "description"
autodoc_member_order = "bysource"
autodoc_mock_imports = []
# -n: every reference must resolve: pages, labels, and downpour_lib's own names. Names outside this
# project (torch, numpy, pandas, the standard library) have no inventory here (no network at build
# time), so a Python reference that does not name downpour_lib is let go.
nitpick_ignore_regex = [(r"py:.*", r"(?!downpour_lib\.).*")]
# The contents of a page list its headings (an API page's modules), not every class and function
# autodoc documents: Furo copies the whole navigation tree into each of the guide's pages, and those
# entries made the copying a quarter of the strict build (101 s -> 75 s here, bytecode cached).
toc_object_entries = False
