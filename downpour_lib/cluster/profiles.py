"""Install the ipyparallel profiles in ``cluster_profiles/`` where ``ipcluster --profile=NAME`` looks.

``install_profiles`` copies ``cluster_profiles/profile_NAME/*`` into IPython's profile directory
(``$IPYTHONDIR/profile_NAME``, by default ``~/.ipython``). It is idempotent and never overwrites a
file the user has edited: each installed profile keeps a manifest of the checksums it installed, so a
file whose checksum still matches is ours to update, and any other file is the user's and is kept
unless ``force=True``.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..checkpoint import atomic_write_bytes, atomic_write_text
from ..errors import ConfigError

MANIFEST = ".downpour-profile.json"
#: The repository's profiles (an editable install, the only kind the Makefile and environment.yml make).
BUNDLED = Path(__file__).resolve().parents[2] / "cluster_profiles"


def ipython_dir() -> Path:
    from IPython.paths import get_ipython_dir

    return Path(get_ipython_dir())


def bundled_profiles(source: str | os.PathLike = BUNDLED) -> dict[str, Path]:
    """name -> directory of every ``profile_NAME`` under ``source``."""
    source = Path(source)
    if not source.is_dir():
        raise ConfigError("source", str(source), "give the cluster_profiles/ directory of a downpour "
                          "checkout (pip install -e . keeps it next to downpour_lib)")
    return {p.name.removeprefix("profile_"): p for p in sorted(source.glob("profile_*")) if p.is_dir()}


def profile_dir(name: str, ipython: str | os.PathLike | None = None) -> Path:
    return Path(ipython or ipython_dir()) / f"profile_{name}"


@dataclass(frozen=True)
class Action:
    profile: str
    file: str
    what: str  # installed | updated | unchanged | kept (user-modified) | overwritten (--force)

    def __str__(self) -> str:
        return f"{self.profile:<10} {self.file:<24} {self.what}"


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def install_profile(name: str, source: Path, ipython: str | os.PathLike | None = None,
                    force: bool = False) -> list[Action]:
    dest = profile_dir(name, ipython)
    dest.mkdir(parents=True, exist_ok=True)
    manifest_path = dest / MANIFEST
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    actions = []
    for src in sorted(p for p in source.iterdir() if p.is_file()):
        new = src.read_bytes()
        target = dest / src.name
        if not target.exists():
            what = "installed"
        else:
            have = _digest(target.read_bytes())
            if have == _digest(new):
                what = "unchanged"
            elif have == manifest.get(src.name):  # ours, from an earlier install: update it
                what = "updated"
            elif force:
                what = "overwritten (--force)"
            else:
                actions.append(Action(name, src.name, "kept (changed by you; --force replaces it)"))
                continue
        if what != "unchanged":
            atomic_write_bytes(target, new)
        manifest[src.name] = _digest(new)
        actions.append(Action(name, src.name, what))
    atomic_write_text(manifest_path, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return actions


def install_profiles(names: list[str] | None = None, ipython: str | os.PathLike | None = None,
                     force: bool = False, source: str | os.PathLike = BUNDLED) -> list[Action]:
    """Install the named bundled profiles (all by default); returns what happened to each file."""
    available = bundled_profiles(source)
    for name in names or ():
        if name not in available:
            raise ConfigError("profile", name, "choose one of " + ", ".join(available))
    actions = []
    for name in names or list(available):
        actions += install_profile(name, available[name], ipython, force)
    return actions


def ensure_profile(name: str, ipython: str | os.PathLike | None = None,
                   source: str | os.PathLike = BUNDLED) -> Path:
    """The profile's directory. A bundled profile is installed if it is not there, and brought up
    to date where its files are still as an earlier install left them (edits are kept): a cluster
    started after an upgrade of downpour must not load the older version's profile, whose imports
    may be gone."""
    dest = profile_dir(name, ipython)
    available = bundled_profiles(source)
    if name in available:
        install_profile(name, available[name], ipython)
    elif not (dest / "ipcluster_config.py").exists():
        raise ConfigError("profile", name, f"no {dest} and no bundled profile of that name; "
                          "choose one of " + ", ".join(available))
    return dest
