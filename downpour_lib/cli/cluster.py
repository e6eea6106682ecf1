"""``downpour profiles install|list``, ``downpour notebook run`` and ``downpour lab``."""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

from ..notebooks import CELL_TIMEOUT_S
from . import summary


def add_cluster_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profiles", help=summary("profiles"))
    p.add_argument("action", choices=("install", "list"),
                   help="install: copy the bundled profiles into IPython's directory; list: each "
                        "bundled profile, where it goes and whether it is installed")
    p.add_argument("names", nargs="*", help="profiles to install (default: all)")
    p.add_argument("--force", action="store_true",
                   help="replace files you changed in an installed profile")
    p.add_argument("--ipython-dir", help="IPython's directory (default: $IPYTHONDIR or ~/.ipython)")
    p.set_defaults(func=cmd_profiles)

    p = sub.add_parser("notebook", help=summary("notebook"))
    p.add_argument("action", choices=("run",), help="run: execute every cell, top to bottom")
    p.add_argument("notebook", help="the notebook's path (notebooks/NN_name.ipynb)")
    p.add_argument("-p", "--parameter", action="append", default=[], metavar="NAME=VALUE",
                   help="override a name of the notebook's `parameters` cell (a Python literal, "
                        "else a string); repeatable")
    saved = p.add_mutually_exclusive_group()
    saved.add_argument("--output", help="save the executed notebook (its outputs and figures) here "
                                        "(default: results/<host>/notebooks/NAME.ipynb, beside "
                                        "the notebook's own results)")
    saved.add_argument("--no-save", action="store_true",
                       help="do not save the executed notebook")
    p.add_argument("--timeout", type=float, default=CELL_TIMEOUT_S,
                   help="seconds per cell (default: %(default)g)")
    p.set_defaults(func=cmd_notebook, output_files=("output",))


def cmd_profiles(args: argparse.Namespace) -> int:
    from ..cluster.profiles import bundled_profiles, install_profiles, profile_dir

    if args.action == "list":
        for name, source in bundled_profiles().items():
            dest = profile_dir(name, args.ipython_dir)
            state = "installed" if (dest / "ipcluster_config.py").exists() else "not installed"
            print(f"{name:<10} {source} -> {dest} ({state})")
        return 0
    for action in install_profiles(args.names or None, args.ipython_dir, args.force):
        print(action)
    print(f"profiles are in {profile_dir('NAME', args.ipython_dir)}; start one with "
          "`ipcluster start --profile=NAME -n N`")
    return 0


#: A value holding one of these was meant as a Python literal (a list, a dict, a quoted string):
#: one that does not parse is a typo to refuse, not a string to pass on (``workers='[1,'``).
LITERAL_MARKS = "[](){}'\""


def parse_parameter(text: str) -> tuple[str, object]:
    name, sep, value = text.partition("=")
    if not sep or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"{text!r}: give NAME=VALUE, e.g. steps=10")
    try:
        return name, ast.literal_eval(value)
    except (ValueError, SyntaxError) as exc:
        if any(mark in value for mark in LITERAL_MARKS):
            why = exc.msg if isinstance(exc, SyntaxError) else "not a Python literal"
            raise argparse.ArgumentTypeError(
                f"parameter {name}={value!r} is not valid: {why}; give a Python literal, e.g. "
                f"{name}='[1, 2]' or {name}='\"text\"' (shell-quoted), or a plain word as a "
                "string") from None
        return name, value


def saved_notebook(notebook: str, output: str | None, no_save: bool) -> Path | None:
    """Where ``downpour notebook run`` keeps the executed notebook: ``output``, None with
    ``no_save``, else ``results/<host>/notebooks/NAME.ipynb`` under the results directory the
    notebooks write to (``../results`` from the notebook's directory)."""
    if no_save:
        return None
    if output:
        return Path(output)
    from ..study.core import host_dirname

    return results_root(notebook) / host_dirname() / "notebooks" / Path(notebook).name


def results_root(notebook: str) -> Path:
    return Path(notebook).resolve().parent.parent / "results"


def written_since(root: Path, start: float, skip: Path | None) -> list[str]:
    """The directories under ``root`` holding files written since ``start`` (a study's CSVs and
    figures), each with how many: 'results/vm/scaling (3 files)'."""
    counts: dict[Path, int] = {}
    if root.is_dir():
        for path in root.rglob("*"):
            try:
                fresh = path.is_file() and path.stat().st_mtime >= start
            except OSError:
                continue
            if fresh and path != skip:
                where = path.parent if path.parent.name != "figures" else path.parent.parent
                counts[where] = counts.get(where, 0) + 1
    return [f"{_shown(d)} ({n} file{'s' if n > 1 else ''})" for d, n in sorted(counts.items())]


def _shown(path: Path) -> str:
    """``path`` relative to the working directory where it is under it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def cmd_notebook(args: argparse.Namespace) -> int:
    import time

    from ..notebooks import NotebookError, run_notebook

    try:
        params = dict(parse_parameter(p) for p in args.parameter)
    except argparse.ArgumentTypeError as exc:
        print(f"downpour notebook: error: {exc}", file=sys.stderr)
        return 2
    if not args.timeout > 0:  # nbclient reads 0 or less as no limit at all; NaN as none too
        print(f"downpour notebook: error: --timeout={args.timeout:g} is not valid: seconds a cell may "
              f"run, > 0 (default {CELL_TIMEOUT_S:g})", file=sys.stderr)
        return 2
    output = saved_notebook(args.notebook, args.output, args.no_save)
    given = ", ".join(f"{k}={v!r}" for k, v in params.items()) or "its defaults"
    print(f"downpour notebook: running {args.notebook} with {given}", flush=True)
    start = time.time()
    try:
        run_notebook(args.notebook, params, output=output, timeout_s=args.timeout, echo=True)
    except NotebookError as exc:
        kept = f" (the executed notebook, up to the failing cell: {_shown(output)})" if output else ""
        if exc.bad_input:  # a parameter the library refused: its one line, as a flag's would be
            print(f"downpour notebook: error: {exc.bad_input}{kept}", file=sys.stderr)
            return 2
        print(f"downpour notebook: {exc}{kept}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:  # Ctrl-C: the cell was interrupted, the kernel shut down
        kept = f"; the executed notebook, up to there: {_shown(output)}" if output else ""
        print(f"downpour notebook: {exc or args.notebook + ': interrupted'}{kept}", file=sys.stderr)
        return 130
    lines = [f"downpour notebook: {args.notebook} ran in {time.time() - start:.0f} s"]
    if output:
        lines.append(f"  executed notebook, with its outputs and figures: {_shown(output)}")
    else:
        lines.append("  executed notebook not saved (--no-save)")
    lines += [f"  wrote {where}" for where in written_since(results_root(args.notebook), start,
                                                             output and output.resolve())]
    print("\n".join(lines), flush=True)
    return 0


def add_lab_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("lab", help=summary("lab"))
    p.add_argument("directory", nargs="?", default="notebooks",
                   help="the notebooks' directory (default: notebooks); any other argument goes to "
                        "`jupyter lab`, written --name=value (e.g. --no-browser --port=8890)")
    # `downpour lab --no-browser` must reach jupyter lab: main() hands over what argparse does not know
    p.set_defaults(func=cmd_lab, passes_unknown_args=True)


def cmd_lab(args: argparse.Namespace) -> int:
    import os

    from ..notebooks import lab_command

    try:
        import jupyterlab  # noqa: F401
    except ImportError:
        print("downpour lab: error: JupyterLab is not installed here: `make lab` installs it "
              "(or pip install -e '.[notebooks]')", file=sys.stderr)
        return 2
    argv, env = lab_command(args.directory, args.unknown_args)
    os.execve(argv[0], argv, env)  # Ctrl-C and the server's own shutdown reach JupyterLab itself
