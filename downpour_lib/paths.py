"""Where a run writes, checked before it trains: an output path that cannot be written is found in the
pre-flight, not at the first checkpoint an hour into the allocation.

A path need not exist yet (the run creates it): what is checked is that nothing in the way is a
file where a directory is wanted (or the reverse), and that a file can be made in the directory the
run writes into, or in its nearest existing ancestor. The check makes one empty file there and
removes it at once: permission bits do not tell (root passes them, and an NFS export that squashes
root refuses it anyway; a read-only mount refuses everyone).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import ConfigError


def _nearest_existing(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path("/")


def _check(field: str, path: Path, want_dir: bool) -> None:
    there = _nearest_existing(path)
    if there == path:
        if want_dir and not path.is_dir():
            raise ConfigError(field, str(path), "is a file, and a directory is wanted here: give a "
                              "directory (it is created if missing)")
        if not want_dir and path.is_dir():
            raise ConfigError(field, str(path), "is a directory, and a file is wanted here: give "
                              "a file's path, e.g. " + str(path / _example_name(field)))
        target = path if want_dir else path.parent
        problem = _unwritable(target)
        if problem:
            raise ConfigError(field, str(path), f"cannot be written: {target}: {problem}; give a "
                              "directory you can write to")
        return
    if not there.is_dir():
        raise ConfigError(field, str(path), f"cannot be created: {there} is a file, not a "
                          "directory")
    problem = _unwritable(there)
    if problem:
        raise ConfigError(field, str(path), f"cannot be created: {there}: {problem}; give a "
                          "directory you can write to")


def _example_name(field: str) -> str:
    """A file name for ``field``'s example: summary_json -> summary.json, json -> rows.json,
    csv -> rows.csv, output (a notebook run's) -> output.ipynb, anything else -> FIELD.json."""
    stem, _, kind = field.rpartition("_")
    if kind in ("json", "csv"):
        return f"{stem or 'rows'}.{kind}"
    return f"{field}.ipynb" if field == "output" else f"{field}.json"


def _unwritable(directory: Path) -> str | None:
    """Why no file can be made in ``directory`` (None: one can)."""
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".downpour-probe-"):
            return None
    except OSError as exc:
        return exc.strerror or str(exc)


def check_output_dir(field: str, path: str | os.PathLike | None) -> None:
    """``path`` is, or can be created as, a directory this process can write into."""
    if path is not None and str(path) != "":
        _check(field, Path(path).expanduser().absolute(), want_dir=True)


def check_output_file(field: str, path: str | os.PathLike | None) -> None:
    """``path`` is, or can be created as, a file this process can write."""
    if path is not None and str(path) != "":
        _check(field, Path(path).expanduser().absolute(), want_dir=False)


def check_new_file(field: str, path: str | os.PathLike | None) -> None:
    """``path`` can be written and is not there yet: a run's record (its summary) is never
    overwritten by another run's (e.g. a job id that a restarted Slurm gives again)."""
    if path is not None and str(path) != "":
        full = Path(path).expanduser().absolute()
        if full.is_file():
            raise ConfigError(field, str(path), "exists: another run's, which this run would "
                              "overwrite; give a new path, or move that file away first")
        check_output_file(field, path)
