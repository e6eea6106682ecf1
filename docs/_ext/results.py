"""Tables made at build time from committed results: nothing measured is typed into a page.

``{results-table}`` reads a CSV or a JSON list of rows under results/, selects, optionally pivots,
formats and emits a table, with a line saying which machine, commit and date measured it (from the
rows' own ``host``/``cores``/``cpu_model``/``gpu``/``git_sha``/``timestamp`` columns, or from ``:meta:``,
a file of the same run that has them). A table whose provenance cannot be found fails the build.
``{paths-table}`` prints the mpi backend's routing tables from the code itself (``comm/mpi/paths.py``).
``notebook_page`` writes a notebook's markdown and code, with figures, as a page (not executed).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from docutils.parsers.rst import directives
from sphinx.util.docutils import SphinxDirective

ROOT = Path(__file__).resolve().parents[2]
MACHINE = ("host", "cores", "cpu_model", "gpu")


def load(path: Path) -> pd.DataFrame:
    if path.suffix == ".json":
        rows = json.loads(path.read_text())
        return pd.DataFrame(rows if isinstance(rows, list) else [rows])
    return pd.read_csv(path)


def committed(path: Path) -> str:
    """The date the file was last committed (its rows carry none)."""
    import subprocess

    out = subprocess.run(["git", "log", "-1", "--format=%cs", "--", str(path)], cwd=ROOT,
                         capture_output=True, text=True)
    return out.stdout.strip()


def provenance(frames: list[pd.DataFrame], where: str, measured: str = "", path: Path | None = None) -> str:
    """'host vm, 2 cores, AMD EPYC; commit 2a67bf9; 2026-11-30': every distinct value the rows hold."""
    def distinct(col):
        for df in frames:
            if col in df and df[col].notna().any():
                return sorted({str(v) for v in df[col].dropna()})
        return []
    machine = []
    for col in MACHINE:
        values = distinct(col)
        if values:
            label = {"host": "host ", "cores": "", "cpu_model": "", "gpu": ""}[col]
            unit = " cores" if col == "cores" else ""
            machine.append(" / ".join(f"{label}{v.removesuffix('.0')}{unit}" for v in values))
    shas = sorted({s[:7] + (" (uncommitted changes)" if s.endswith("+dirty") else "")
                   for s in distinct("git_sha")})
    dates = sorted({v[:10] for v in distinct("timestamp")})
    if measured and not (machine and shas):
        machine, shas = [measured + " (results/reference/README.md)"], ["as there"]
    if not dates and path is not None and committed(path):
        dates = ["committed " + committed(path)]
    missing = [what for what, got in (("machine", machine), ("commit", shas), ("date", dates)) if not got]
    if missing:
        raise ValueError(f"{where}: the rows say no {', '.join(missing)}; give :meta: a file of the same "
                         "run that does (a runs.csv beside it)")
    when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    commit = "" if shas == ["as there"] else f"; commit {', '.join(shas)}"
    return f"{', '.join(machine)}{commit}; {when}"


def size(n) -> str:
    n = int(n)
    for unit, scale in (("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def cell(value, fmt: str | None) -> str:
    if isinstance(value, float) and pd.isna(value):
        return ""
    if fmt == "size":
        return size(value)
    if fmt:
        return format(value, fmt)
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value).replace("|", "\\|")


def markdown_table(df: pd.DataFrame, formats: dict[str, str]) -> list[str]:
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, row in df.iterrows():
        lines.append("| " + " | ".join(cell(row[c], formats.get(str(c))) for c in df.columns) + " |")
    return lines


def pairs(text: str | None, sep: str = ":") -> dict[str, str]:
    """'a: x; b: y' -> {'a': 'x', 'b': 'y'}"""
    out = {}
    for part in (text or "").split(";"):
        if part.strip():
            key, _, value = part.partition(sep)
            out[key.strip()] = value.strip()
    return out


class ResultsTable(SphinxDirective):
    """```{results-table} results/reference/gpu/bench.json
    :query: backend == "mpi"              (pandas DataFrame.query)
    :before: mb = bytes / 1e6             (before the pivot; several: separated by ;)
    :pivot: index=bytes; columns=backend; values=p50_s
    :eval: ours over Open MPI's = mpi / mpi4py     (after the pivot; several: separated by ;)
    :columns: what as run; images_per_s as images/s   (the order, and headers)
    :format: images_per_s: .0f; bytes: size
    :meta: results/reference/scaling/runs.csv   (where the rows lack machine, commit, date)
    :measured: the machine and commit results/reference/README.md records, where no file of the run
               has them (the date is then the file's last commit)
    :caption: a sentence before the provenance
    ```"""

    required_arguments = 1
    has_content = False
    option_spec = {name: directives.unchanged for name in
                   ("query", "before", "pivot", "eval", "columns", "format", "meta", "caption", "sort",
                    "measured")}

    def run(self):
        rel = self.arguments[0]
        path = ROOT / rel
        self.env.note_dependency(str(path))
        df = load(path)
        frames = [df]
        if "meta" in self.options:
            meta = ROOT / self.options["meta"]
            self.env.note_dependency(str(meta))
            frames.append(load(meta))
        try:
            origin = provenance(frames, rel, self.options.get("measured", ""), path)
            if "query" in self.options:
                df = df.query(self.options["query"])
            for line in (self.options.get("before") or "").split(";"):
                if line.strip():
                    name, _, expr = line.partition("=")
                    df[name.strip()] = df.eval(expr.strip())
            if "pivot" in self.options:
                p = pairs(self.options["pivot"], "=")
                index = [c.strip() for c in p["index"].split(",")]
                values = [c.strip() for c in p["values"].split(",")]
                if "columns" in p:  # one column per value of these (joined by a space), medians
                    columns = [c.strip() for c in p["columns"].split(",")]
                    df = df.pivot_table(index=index, columns=columns, values=values[0], aggfunc="median")
                    df.columns = [" ".join(str(v) for v in (c if isinstance(c, tuple) else (c,)))
                                  for c in df.columns]
                else:  # one row per index: the median of each value, and how many rows it took
                    grouped = df.groupby(index)
                    df = grouped[values].median().join(grouped.size().rename("rows"))
                df = df.reset_index()
            for line in (self.options.get("eval") or "").split(";"):
                if line.strip():
                    name, _, expr = line.partition("=")
                    df[name.strip()] = df.eval(expr.strip())
            if "sort" in self.options:
                df = df.sort_values([c.strip() for c in self.options["sort"].split(",")])
            formats = pairs(self.options.get("format"))
            if "columns" in self.options:
                chosen = [c.strip().partition(" as ") for c in self.options["columns"].split(";")
                          if c.strip()]
                df = df[[c for c, _, _ in chosen]]
                renames = {c: h for c, _, h in chosen if h}
                formats = {renames.get(k, k): v for k, v in formats.items()}
                df = df.rename(columns=renames)
        except Exception as e:  # noqa: BLE001 - any failure is the page's: fail the build, saying where
            raise self.error(f"results-table {rel}: {type(e).__name__}: {e}") from e
        if df.empty:
            raise self.error(f"results-table {rel}: no rows left (query {self.options.get('query')!r})")
        caption = self.options.get("caption", "")
        text = markdown_table(df, formats) + [
            "", f"{caption} *Measured on {origin}; generated at build time from `{rel}`.*".strip()]
        return self.parse_text_to_nodes("\n".join(text))


class PathsTable(SphinxDirective):
    """The mpi backend's routing table, read from ``downpour_lib.comm.mpi.paths`` (the code's own)."""

    has_content = False
    option_spec = {"in-c": directives.flag}

    def run(self):
        from downpour_lib.comm.mpi import paths

        names = {"shm": "shared memory", "mpi": "gate + blocking call", "nb": "nonblocking call"}
        lines = ["| operation | ranks | path, from the size given |", "|---|---|---|"]
        for op, rows in paths.table("in-c" in self.options).items():
            low = 1
            for most, steps in rows:
                ranks = f"{low}-{most}" if most < 1 << 20 and most != low else (
                    f"{low}" if most == low else f"{low} or more")
                shown = [f"{names['nb']} below {size(steps[0][0])}"] if steps[0][0] > 1 else []
                shown += [f"{names[p]} from {size(start) if start > 1 else 'the first byte'}"
                          for start, p in steps]
                lines.append(f"| {op} | {ranks} | {'; '.join(shown)} |")
                low = most + 1
        return self.parse_text_to_nodes("\n".join(lines))


def notebook_page(app) -> None:
    """docs/_generated/scaling_notebook.md: notebook 02's cells (not executed), the reference figures
    first, then each plotting cell followed by the figure it draws."""
    nb = json.loads((ROOT / "notebooks/02_scaling_study.ipynb").read_text())
    figures = "../../results/reference/scaling/figures"
    drawn = {"throughput_figure": "throughput", "speedup_figure": "speedup",
             "efficiency_figure": "efficiency", "breakdown_figure": "breakdown",
             "scaling_model_figure": "scaling_model"}
    out = ["# The scaling study's notebook, with the reference results", "",
           "Notebook `notebooks/02_scaling_study.ipynb` as committed (no outputs), shown with the figures "
           "`make study` drew from the reference run (`results/reference/scaling/`; "
           "{doc}`the study <../studies>` says which machine and commit). Nothing here was executed to "
           "build this page: `make study` runs the notebook on your machine.", "",
           "## The result first", ""]
    for name in ("efficiency", "throughput", "breakdown", "scaling_model"):
        out += [f"![{name}]({figures}/{name}.png)", ""]
    for c in nb["cells"]:
        src = "".join(c["source"]).rstrip()
        if c["cell_type"] == "markdown":
            # the notebook's own headings sit one level under this page's title
            out += ["#" + line if line.startswith("#") else line for line in src.splitlines()] + [""]
        elif c["cell_type"] == "code":
            out += ["```python", src, "```", ""]
            for call, name in drawn.items():
                if call in src:
                    out += [f"![{name}]({figures}/{name}.png)", ""]
    target = Path(app.srcdir) / "_generated" / "scaling_notebook.md"
    target.parent.mkdir(exist_ok=True)
    text = "\n".join(out) + "\n"
    if not target.exists() or target.read_text() != text:
        target.write_text(text)


def setup(app):
    app.add_directive("results-table", ResultsTable)
    app.add_directive("paths-table", PathsTable)
    app.connect("builder-inited", notebook_page)
    return {"parallel_read_safe": True, "version": "1"}
