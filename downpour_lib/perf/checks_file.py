"""Your own results as checks of the performance model (``downpour model check --checks FILE.csv``):
scaling you measured on your cluster, or a paper's that the package's table (``presets``) lacks,
a row each, predicted as the package's checks are.

Every row gives ``claim``; ``hardware``, a preset's name or a hardware YAML file (a path relative to
the CSV's folder); ``model``, one of that file's; ``workers``; ``published``. What ``published``
is depends on the row:

- an efficiency, a share (0.9 for 90 %): ``algorithm``'s throughput at ``workers`` against
  ``against`` workers (1 when empty: one worker alone; a node's devices for "N nodes against one
  node"), each run accumulating ``accumulation`` and ``against_accumulation`` passes a step where
  they differ (the hardware file's when empty);
- with ``against_algorithm``, a speedup (3 for "3x faster"): ``algorithm``'s throughput over
  ``against_algorithm``'s, both at ``workers``: a claim that one algorithm beats another.

``algorithm`` is ``allreduce`` when empty; ``options`` are its options, ``KEY=VALUE`` separated by
spaces (``period=8``), those a prediction reads (``perfmodel.readable_options``); ``source`` says
where the number comes from. Each row is the band of what the hardware file does not measure,
its middle the point; where a row divides two predictions (against other workers, accumulation or
algorithm), each end by the same end (``perfmodel.relative``). A bad row is one ``ConfigError``
naming the row, the column and what would work.
"""

from __future__ import annotations

import math
from pathlib import Path

from ..errors import ConfigError, unknown_name
from .calibration import Calibration
from .hardware import load_hardware
from .perfmodel import (
    MODELLED_ALGORITHMS,
    option_value,
    options_for,
    predict,
    readable_options,
    relative,
)
from .presets import PRESETS, Published, accumulating, kind_of

#: a checks file's columns: those every row gives, then the optional ones
CHECK_COLUMNS = ("claim", "hardware", "model", "workers", "published")
CHECK_OPTIONAL = ("source", "against", "accumulation", "against_accumulation", "algorithm",
                  "options", "against_algorithm")


def checks_from_file(path) -> list[Published]:
    """The rows of the CSV at ``path`` (the module docstring's columns) as checks: efficiency rows
    as ``presets.published_checks``' are, speedup rows (``against_algorithm``) with unit
    ``speedup`` and no kind."""
    import pandas as pd

    path = Path(path)
    try:
        table = pd.read_csv(path, dtype=str, keep_default_na=False)
    except FileNotFoundError:
        raise ConfigError("checks", str(path), "no such file: a CSV with columns "
                          + ", ".join(CHECK_COLUMNS)) from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise ConfigError("checks", str(path), f"not a CSV ({str(exc).strip()})") from None
    missing = [c for c in CHECK_COLUMNS if c not in table.columns]
    unknown = [c for c in table.columns if c not in CHECK_COLUMNS + CHECK_OPTIONAL]
    if missing or unknown or table.empty:
        why = (f"lacks {', '.join(missing)}" if missing else
               f"has unknown columns {', '.join(unknown)}" if unknown else "has no rows")
        raise ConfigError("checks", str(path), f"{why}: give a row a check with "
                          + ", ".join(CHECK_COLUMNS) + " (optional: " + ", ".join(CHECK_OPTIONAL)
                          + ")")
    hardware: dict[str, Calibration] = {}  # each file read once
    return [_check_from_row(i, row, path.parent, hardware)
            for i, row in enumerate(table.to_dict("records"), start=1)]


def _check_from_row(i: int, row: dict[str, str], folder, hardware: dict[str, Calibration]) -> Published:
    """Row ``i`` of a checks file (``checks_from_file``) predicted; ``hardware``: the files read
    so far, by the name the rows give."""
    name = row["hardware"].strip()
    if name not in hardware:
        if name in PRESETS:
            hardware[name] = PRESETS[name]
        elif name.endswith((".yaml", ".yml")):
            hardware[name] = load_hardware(folder / name)
        else:
            raise ConfigError(f"checks row {i} hardware", name, "a preset ("
                              + ", ".join(PRESETS) + ") or a hardware .yaml file")
    cal, model = hardware[name], row["model"].strip()
    if model not in cal.workloads:
        raise ConfigError(f"checks row {i} model", model, f"{name} has compute for "
                          + ", ".join(sorted(cal.workloads)))
    algorithm = _algorithm(i, "algorithm", row.get("algorithm", "")) or "allreduce"
    rival = _algorithm(i, "against_algorithm", row.get("against_algorithm", ""))
    options = _options(i, algorithm, row.get("options", ""))
    workers = _whole_number(i, "workers", row["workers"], None)
    against = _whole_number(i, "against", row.get("against", ""), None)
    if rival and against not in (None, workers):
        raise ConfigError(f"checks row {i} against", against, "empty with against_algorithm: a "
                          f"speedup compares the two algorithms at the row's workers ({workers})")
    against = against or (workers if rival else 1)
    if against > workers:
        raise ConfigError(f"checks row {i} against", against, f"at most the row's workers ({workers})")
    own = _whole_number(i, "accumulation", row.get("accumulation", ""), None)
    theirs = _whole_number(i, "against_accumulation", row.get("against_accumulation", ""), own)
    try:
        published = float(row["published"])
    except ValueError:
        published = math.nan
    unit = "speedup" if rival else "efficiency"
    if rival and not 0 < published < math.inf:
        raise ConfigError(f"checks row {i} published", row["published"],
                          "a speedup over against_algorithm, a number > 0, e.g. 3 for 3x faster")
    if not rival and not 0 < published <= 1.5:
        raise ConfigError(f"checks row {i} published", row["published"],
                          "an efficiency as a share, e.g. 0.9 for 90 %")
    if against == 1 and own is None and not rival:  # as the package's checks against one worker
        p = predict(cal, algorithm, workers, model, options)
        point, low, high = p.efficiency, p.efficiency_low, p.efficiency_high
    else:
        point, low, high = relative(accumulating(cal, model, own, workers, algorithm, options),
                                    accumulating(cal, model, theirs, against, rival or algorithm,
                                                 None if rival else options))
    return Published(row["claim"].strip(), row.get("source", "").strip(), published, point,
                     unit, "reported", low, high,
                     kind="" if rival else kind_of(cal, model, workers))


def _algorithm(i: int, field: str, text: str) -> str:
    """Row ``i``'s modelled algorithm in ``field``; empty where it gives none."""
    name = text.strip()
    if name and name not in MODELLED_ALGORITHMS:
        raise unknown_name(f"checks row {i} {field}", name, MODELLED_ALGORITHMS)
    return name


def _options(i: int, algorithm: str, text: str) -> dict[str, object]:
    """Row ``i``'s options of ``algorithm``: ``KEY=VALUE`` separated by spaces, each value an
    int, a float or text, each key one a prediction reads, each value one its options take."""
    options = {}
    for item in text.split():
        key, sep, raw = item.partition("=")
        if not (sep and key and raw) or key not in readable_options(algorithm):
            raise ConfigError(f"checks row {i} options", item, f"KEY=VALUE of {algorithm}, the "
                              "keys a prediction reads: " + ", ".join(readable_options(algorithm)))
        options[key] = option_value(raw)
    try:
        options_for(algorithm, options)
    except ConfigError as exc:
        raise ConfigError(f"checks row {i} options {exc.field}", exc.value, exc.expected) from None
    return options


def _whole_number(i: int, field: str, text: str, default: int | None) -> int | None:
    """A checks file's whole number >= 1 in ``field`` of row ``i``; ``default`` where empty."""
    if text.strip() == "":
        return default
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"checks row {i} {field}", text, "a whole number >= 1")
    return value
