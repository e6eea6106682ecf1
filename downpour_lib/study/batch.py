"""Several trainings in one launch: what a launcher runs on every rank to train a batch of
configurations one after another in one session, so that the ranks start (and import torch, 3-4 s of
CPU each) once for the batch, not once per run.

``batch_command(configs, directory)`` writes ``directory/batch.json`` (name -> configuration, in
order) and returns the command; each run writes its records to ``directory/<name>/`` (steps.csv,
evals.csv, summary.json), as ``downpour train --output-dir`` does, and ``read_batch`` reads the
summaries back. ``model_validate`` trains its algorithms this way, once per link setting, after a
``downpour bench collectives`` of the link in the same session (``bench``: its flags, run before
the first training): one launch a setting where it was two (a rank's start-up: 6-7 s of CPU). The
runs share one process group, so they share its backend, device and timeout; any exception on any
rank ends the job, naming the rank (``runtime.abort_on_error``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ..config import TrainConfig
from ..errors import ConfigError

BATCH_FILE = "batch.json"
BENCH_FILE = "bench.json"


def batch_command(configs: dict[str, TrainConfig], directory: Path,
                  bench: list[str] | None = None) -> list[str]:
    """One rank's command to train ``configs`` in order (written to ``directory``), after the
    ``downpour bench collectives`` that the flags ``bench`` ask for, if any (checked here)."""
    session = {_session(config) for config in configs.values()}
    if len(session) > 1:
        raise ConfigError("configs", sorted(session), "one backend, device, timeout_s and "
                          "startup_timeout_s for every run of a batch: they share its process group")
    runs = {}
    for name, config in configs.items():
        if not name or "/" in name or name.startswith("."):
            raise ConfigError("name", name, "a plain directory name")
        runs[name] = {**config.to_dict(), "output_dir": str(directory / name)}
    if bench is not None:  # bad flags: here, before any rank starts
        from ..bench import collectives

        collectives.check(_bench_args(bench))
        (directory / BENCH_FILE).write_text(json.dumps(bench))
    else:  # a directory used before: not its bench again
        (directory / BENCH_FILE).unlink(missing_ok=True)
    (directory / BATCH_FILE).write_text(json.dumps(runs, default=str))
    return [sys.executable, "-m", "downpour_lib.study.batch", str(directory)]


def read_batch(directory: Path, names) -> dict[str, dict]:
    """name -> the summary its run wrote; a run without one is missing from the result."""
    found = {}
    for name in names:
        path = directory / name / "summary.json"
        if path.is_file():
            summary = json.loads(path.read_text())
            summary.pop("config", None)
            found[name] = summary
    return found


def _bench_args(flags: list[str]):
    """``flags`` parsed as ``downpour bench collectives`` parses them (its own parser: the command
    line is above the studies)."""
    from ..bench import collectives
    from ..errors import UsageError, UsageErrorParser

    parser = UsageErrorParser(prog="downpour bench")
    collectives.add_parser(parser.add_subparsers(dest="benchmark", required=True))
    try:
        return parser.parse_args(["collectives", *flags])
    except UsageError as exc:
        raise ConfigError("bench", " ".join(flags), "flags that `downpour bench collectives` takes "
                          f"({exc})") from None


def _session(config: TrainConfig) -> tuple:
    system = config.system
    return (system.backend, system.device, system.timeout_s,
            config.runtime.startup_timeout_s)


def main(directory: str) -> int:
    from .._torch_import import import_torch

    import_torch()
    from ..comm import runtime
    from ..engine import train
    from ..launch_env import discover

    runs = json.loads((Path(directory) / BATCH_FILE).read_text())
    configs = [TrainConfig.from_dict(run) for run in runs.values()]
    backend, device, timeout_s, startup_timeout_s = _session(configs[0])
    bench, flags = None, Path(directory) / BENCH_FILE
    if flags.is_file():  # what only the launch tells (its size, MPI or not): checked on every rank
        from ..bench import collectives  # alike, before any of them waits for another

        args = _bench_args(json.loads(flags.read_text()))
        bench = args, collectives.check(args, discover(os.environ))
    with runtime.abort_on_error():
        ctx = runtime.init(backend, device, timeout_s, startup_timeout_s=startup_timeout_s)
        if bench is not None:
            collectives.in_session(*bench, ctx)
        for config in configs:
            train(config, ctx)
        runtime.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
