"""The run configuration: frozen, validated sections, built from Python, CLI flags or a file.

A ``TrainConfig`` is the algorithm (with its options) and the model, plus seven sections, each a
frozen dataclass (``config_sections``) that validates its own fields on construction (naming
the field, the value and what would work, so a bad run fails before any process blocks):

========== ==============================================================
section    holds
========== ==============================================================
data       data set, its files, the batch, augmentation, loader workers, seed
optim      the update rule, learning rate and its schedule, precision
length     how long it trains and how it is measured (steps or epochs,
           throughput warm-up, evaluation cadence)
system     backend, device, threads, timeout, memory format
emulation  emulated slow workers and emulated compute
outputs    where the run writes (records, trace, checkpoints) and the
           checkpoint it continues
runtime    how a launcher stops and restarts it (preemption signal, requeue)
========== ==============================================================

What makes two runs the same run is declared by each field where it is defined
(``_help(..., identity=...)``, one of ``IDENTITY_RULES``): ``keep`` (a resumed run must keep it),
``match`` (``resume auto`` matches on it), ``measure`` (a study's ``run_id`` keys on it) or
``free``. Checkpoints (``held("keep")``, ``held("match")``) and studies (``identity()``) read
these declarations; a field without one fails at import (``identity_rules``).

A field is read through its section (``config.data.batch_size``): the library, its tests and
the notebooks all do. A flat read (``config.batch_size``) still works but is deprecated: it warns
(``DeprecationWarning``, naming the line), the test suite makes that warning an error, and
``rename_script`` rewrites code written for the flat config. Writing stays flat: the
constructor, ``replace``, ``from_dict``, the CLI flags and YAML/JSON files take flat names
(``TrainConfig(algorithm="ddp", batch_size=64)``), and ``to_dict()`` is flat, with the same keys
as before (a study's CSV columns). Field names are unique across sections.

Checks that need the world size (an algorithm that needs more ranks than it has) are the options'
``roles(world_size)``, which the pre-flight (``planning.plan_run``) calls after reading the
launcher's variables and before rendezvous.
"""

from __future__ import annotations

import dataclasses
import json
import re
import typing
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import user_code

# the sections, and what their fields declare, live in ``config_sections``; config names them too
from .config_sections import (  # noqa: F401 -- the sections' names are config's as before
    DEFAULT_LR,
    IDENTITY_RULES,
    SECTION_OF,
    SECTIONS,
    TOP,
    Augment,
    Backend,
    Data,
    Device,
    Emulation,
    Identity,
    Length,
    Optim,
    Optimizer,
    Outputs,
    Precision,
    Runtime,
    Schedule,
    System,
    _help,
)
from .errors import ConfigError, closest, unknown_name
from .models import MODELS
from .options import OPTIONS, build_options, coerce
from .preempt import in_slurm_job

#: ``downpour train``'s flags that are not fields of a run: a config file cannot hold them
FLAGS_ONLY = ("config", "summary_json", "preflight")


def _unknown_field(name: Any, known: Iterable[str]) -> ConfigError:
    """The error for a config file's (or dict's) key that is no field, with the fix where the key
    is one a user would write: an algorithm's option (it goes under ``options:``), a flag's
    spelling with dashes, a flag of the command line alone."""
    if not isinstance(name, str):
        return unknown_name("config field", name, known)
    takes = [algorithm for algorithm, cls in OPTIONS.items()
             if name in {f.name for f in dataclasses.fields(cls)}]
    if takes:
        return ConfigError("config field", name, f"an option of {', '.join(takes)}: a file gives it "
                                                 f"under options, e.g. options: {{{name}: ...}}")
    if name.replace("-", "_") in known:
        return ConfigError("config field", name, f"a file spells it {name.replace('-', '_')}")
    if name.replace("-", "_") in FLAGS_ONLY:
        return ConfigError("config field", name, f"a flag of downpour train alone: give "
                                                 f"--{name.replace('_', '-')} on its command line")
    return unknown_name("config field", name, known)


@dataclass(frozen=True)
class TrainConfig:
    """One training run: the algorithm, its options and the model, and the sections (module
    docstring). Built from flat names (``TrainConfig(algorithm="ddp", batch_size=64)``), from
    whole sections (``data=Data(...)``), or both: flat names win over a section's values."""

    algorithm: str = _help("training algorithm", identity="keep", default="sync_ps")
    options: Any = _help("the algorithm's own options (a mapping or its options dataclass)",
                         identity="keep", default=None)
    model: str = _help("model name (see `downpour models`), or your own: package.module:function",
                       identity="keep", default="mlp")
    data: Data = _help("the data set, batch and seed", default=None)
    optim: Optim = _help("the update rule and its learning rate", default=None)
    length: Length = _help("how long it trains and how it is measured", default=None)
    system: System = _help("backend, device, threads, timeout", default=None)
    emulation: Emulation = _help("emulated slow workers and compute", default=None)
    outputs: Outputs = _help("what the run writes, and the checkpoint it continues", default=None)
    runtime: Runtime = _help("preemption and requeue", default=None)

    def __init__(self, algorithm: str = "sync_ps", options: Any = None, model: str = "mlp", *,
                 data: Data | None = None, optim: Optim | None = None,
                 length: Length | None = None, system: System | None = None,
                 emulation: Emulation | None = None, outputs: Outputs | None = None,
                 runtime: Runtime | None = None, **flat: Any) -> None:
        given = {"data": data, "optim": optim, "length": length, "system": system,
                 "emulation": emulation, "outputs": outputs, "runtime": runtime}
        for name in flat:
            if name not in SECTION_OF:  # Python's own error, with the field meant
                meant = closest(name, [*TOP, *SECTION_OF])
                raise TypeError(f"TrainConfig() got an unexpected keyword argument {name!r}"
                                + (f"; did you mean {meant}?" if meant else ""))
        if algorithm not in OPTIONS:
            raise unknown_name("algorithm", algorithm, OPTIONS)
        if callable(model):  # a function or class of yours, e.g. from a notebook cell
            model = user_code.register("model", model.__name__, model, MODELS)
        if model not in MODELS and not user_code.is_user_code("model", model):
            raise user_code.unknown("model", model, MODELS)
        options = build_options(algorithm, OPTIONS[algorithm], options, OPTIONS)
        for name, value in (("algorithm", algorithm), ("options", options), ("model", model)):
            object.__setattr__(self, name, value)
        for name, cls in SECTIONS.items():
            section, mine = given[name], {k: v for k, v in flat.items() if SECTION_OF[k] == name}
            if section is not None and not isinstance(section, cls):
                raise ConfigError(name, section, f"give a {cls.__name__} (or its fields by name)")
            if section is None or mine:
                values = {} if section is None else _values(section)
                values.update(mine)
                section = Optim.of(options, **values) if cls is Optim else cls(**values)
            object.__setattr__(self, name, section)

    # -- flat views --------------------------------------------------------------------------

    @classmethod
    def flat_fields(cls) -> dict[str, dataclasses.Field]:
        """Every flat field (the top ones, then each section's), by name: what flags, files and
        ``to_dict`` use."""
        top = {f.name: f for f in dataclasses.fields(cls) if f.name in TOP}
        return {**top, **{f.name: f for s in SECTIONS.values() for f in dataclasses.fields(s)}}

    @classmethod
    def flat_hints(cls) -> dict[str, Any]:
        """Each flat field's type."""
        hints = {k: v for k, v in typing.get_type_hints(cls).items() if k in TOP}
        for section in SECTIONS.values():
            hints.update(typing.get_type_hints(section))
        return hints

    def replace(self, **changes: Any) -> TrainConfig:
        """A copy with ``changes`` (flat names or whole sections); as dataclasses.replace does."""
        return dataclasses.replace(self, **changes)

    def slurm_resume(self, named: bool = False) -> TrainConfig:
        """The run with resume=auto where a Slurm job restarts it: in a Slurm job, writing
        checkpoints, and naming no resume (``named``: the command line gave --resume, even
        none), so a requeued job continues where it stopped. The one place this rule is written:
        ``downpour train`` and a cluster's engines both ask here."""
        outputs = self.outputs
        if named or outputs.resume is not None or not outputs.checkpoint_dir \
                or not in_slurm_job():
            return self
        return self.replace(resume="auto")

    # -- conversions -------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"algorithm": self.algorithm,
                               "options": dataclasses.asdict(self.options), "model": self.model}
        for name in SECTIONS:
            out.update(_values(getattr(self, name)))
        out["lr_milestones"] = list(self.optim.lr_milestones)  # plain data, as a file holds it
        return out

    def held(self, rule: Identity) -> dict[str, Any]:
        """The flat fields (``to_dict``'s values) that ``rule`` holds (``held_to``): keep, what a
        resumed run must keep; match, what ``resume auto`` and pruning compare."""
        names = set(held_to(rule))
        return {k: v for k, v in self.to_dict().items() if k in names}

    def identity(self) -> dict[str, Any]:
        """The flat fields that make the run, for a study's ``run_id``: ``to_dict``'s, less those
        whose rule is ``free`` (where the run writes, how it is stopped)."""
        return self.held("measure")

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> TrainConfig:
        """Build from typed values, a file's or Python's: a string is never read as a number
        (``coerce``); the CLI parses its flags' text before it calls this."""
        known = cls.flat_fields()
        hints = cls.flat_hints()
        kwargs: dict[str, Any] = {}
        for name, value in values.items():
            if name not in known:
                raise _unknown_field(name, known)
            # options as given; a model or data-set function of yours (a notebook's) is itself
            passed = name == "options" or name in ("model", "dataset") and callable(value)
            kwargs[name] = value if passed else coerce(name, hints[name], value)
        return cls(**kwargs)

    @classmethod
    def from_file(cls, path: str | Path, **overrides: Any) -> TrainConfig:
        """Read a YAML or JSON file; ``overrides`` (e.g. parsed CLI flags) win over the file."""
        path = Path(path)
        if not path.is_file():
            raise ConfigError("config", str(path), "no such file; give a .yaml, .yml or .json file")
        if path.suffix not in (".yaml", ".yml", ".json"):
            raise ConfigError("config", str(path), "use a .yaml, .yml or .json file")
        text = path.read_text()
        if path.suffix == ".json":
            try:
                values = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ConfigError("config", str(path), f"line {exc.lineno}, column {exc.colno}: "
                                  f"{exc.msg}") from None
        else:
            values = read_yaml(text, str(path)) or {}
        if not isinstance(values, dict):
            raise ConfigError("config", str(path), "the file must hold a mapping of field: value")
        options = {**(values.get("options") or {}), **(overrides.pop("options", None) or {})}
        return cls.from_dict({**values, **overrides, "options": options})


def rename_script() -> str:
    """A sed -E script that turns code written for the flat config into dotted reads
    (``config.X``, ``cfg.X``, ``self.config.X`` -> ``config.<section>.X``): for merging a branch
    written before the sections. Idempotent (no section is named as a field); keyword arguments
    and ``to_dict()`` keys stay flat."""
    return "".join(rf"s/\b(config|cfg)\.{name}\b/\1.{section}.{name}/g" + "\n"
                   for name, section in SECTION_OF.items())


def _values(section: Any) -> dict[str, Any]:
    return {f.name: getattr(section, f.name) for f in dataclasses.fields(section)}


def _flat(name: str, section: str) -> property:
    """``config.<name>``: reads ``config.<section>.<name>`` and says so (a DeprecationWarning
    naming the reader's line), so code written for the flat config keeps working and learns the
    dotted read. The test suite makes the warning an error (pyproject's filterwarnings)."""
    message = f"config.{name} is config.{section}.{name}; read it through its section"

    def read(self: TrainConfig) -> Any:
        warnings.warn(message, DeprecationWarning, stacklevel=2)  # 2: the line that read it
        return getattr(getattr(self, section), name)

    return property(read, doc=f"``{section}.{name}``, read flat (deprecated)")


for _name, _section in SECTION_OF.items():  # config.batch_size reads config.data.batch_size
    setattr(TrainConfig, _name, _flat(_name, _section))


def identity_rules(fields: Iterable[dataclasses.Field]) -> dict[str, str]:
    """Each field's identity rule (``IDENTITY_RULES``), by name. A field that declares none, or
    another word, is a TypeError naming it: every field says what it does to a run's identity."""
    out = {}
    for f in fields:
        rule = f.metadata.get("identity")
        if rule not in IDENTITY_RULES:
            raise TypeError(f"config field {f.name!r} declares identity={rule!r}: give it one of "
                            f"{', '.join(IDENTITY_RULES)} (_help(..., identity=...))")
        out[f.name] = rule
    return out


#: flat field name -> its identity rule, as each field declares it
IDENTITY = identity_rules(TrainConfig.flat_fields().values())


def held_to(rule: Identity) -> tuple[str, ...]:
    """The flat fields ``rule`` holds, in flat order: those that declare it or a stricter rule.
    ``keep``: what a resumed run must keep; ``match``: what ``resume auto`` matches on;
    ``measure``: what a study's run identity keys on."""
    stricter = IDENTITY_RULES[:IDENTITY_RULES.index(rule) + 1]
    return tuple(name for name, declared in IDENTITY.items() if declared in stricter)
def read_yaml(text: str, name: str = "<text>") -> Any:
    """YAML, with numbers such as 1e-3 read as numbers (YAML 1.2 does; PyYAML's YAML 1.1 wants
    1.0e-3 and reads 1e-3 as a string, which a number field here refuses). A syntax error is a
    ConfigError naming ``name`` (the file), the line and the column, counted from 1."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_implicit_resolver("tag:yaml.org,2002:float",
                                 re.compile(r"^[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)[eE][-+]?[0-9]+$"),
                                 list("-+.0123456789"))
    try:
        return yaml.load(text, Loader=Loader)  # a SafeLoader: plain data only
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        what = " ".join(str(x) for x in (getattr(exc, "context", None),
                                         getattr(exc, "problem", None)) if x) or str(exc)
        raise ConfigError("config", name, where + what) from None
