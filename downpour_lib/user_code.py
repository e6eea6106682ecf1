"""Your own model and data set, by import path or defined in a notebook (docs/own_model.md).

A model or data set is named, wherever a built-in name goes, by an import path
``package.module:function`` (on ``sys.path``, or a ``.py`` file in the working directory) or by a
name given in this process with ``models.register`` / ``data.register`` (or by passing the function
or class itself to ``TrainConfig``).

- A model function takes ``(input_shape, num_classes)`` and returns an ``nn.Module`` whose logits
  are ``(batch, classes)``, or ``(batch, context, vocabulary)`` for a language model.
- A data-set function takes the run's ``data_dir`` and returns ``(train, validation)`` torch
  Datasets of ``(x, y)`` pairs (``data/yours.py`` reads them).

A cluster's engines, and a study's mpiexec ranks, are sent the functions by value (cloudpickle, as
ipyparallel sends a notebook's functions), with the hash of their source the sender saw: the run's
summary records each name and that hash.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any, Literal

from .errors import ConfigError, closest, unknown_name

Kind = Literal["model", "dataset"]

#: Names given in this process (``register``), by kind: name -> the function.
DEFINED: dict[Kind, dict[str, Callable[..., Any]]] = {"model": {}, "dataset": {}}

_CONTRACT = {"model": "a function (input_shape, num_classes) -> nn.Module",
             "dataset": "a function (data_dir) -> (train, validation) data sets"}
#: the arguments each kind is called with, by name, for a signature that cannot take them
_ARGUMENTS = {"model": ("input_shape", "num_classes"), "dataset": ("data_dir",)}


def is_user_code(kind: Kind, name: str) -> bool:
    """Whether ``name`` is an import path or a name registered here (not a built-in)."""
    return ":" in name or name in DEFINED[kind]


def register(kind: Kind, name: str, function: Callable[..., Any], builtins: Any) -> str:
    """Give ``function`` the name ``name`` in this process (and, through ``shipped``, on a
    cluster's engines); refuses a built-in's name and anything not callable."""
    if not isinstance(name, str) or not name or ":" in name:
        raise ConfigError(kind, name, "a plain name without ':' (an import path needs no register)")
    if name in builtins:
        raise ConfigError(kind, name, f"{name!r} is a built-in {kind}; give yours another name, "
                                      f"e.g. 'my_{name}'")
    if not callable(function):
        raise ConfigError(kind, function, _CONTRACT[kind])
    _check_arguments(kind, name, function)
    DEFINED[kind][name] = function
    return name


def unknown(kind: Kind, name: Any, builtins: Iterable[str]) -> ConfigError:
    """The error for a ``kind`` that is neither a built-in nor an import path: a dotted path
    (``mymodels.build``) is most likely an import path with a dot for its colon."""
    names = [*builtins, "package.module:function"]
    if isinstance(name, str) and ":" not in name and "." in name.strip(".") \
            and closest(name, builtins) is None:
        module, _, function = name.rpartition(".")
        return ConfigError(kind, name, f"did you mean {module}:{function}? An import path names "
                                       "its function after a colon; or choose one of "
                                       + ", ".join(sorted(names)))
    return unknown_name(kind, name, names)


def resolve(kind: Kind, name: str) -> Callable[..., Any]:
    """The function ``name`` stands for; ConfigError naming the value and what would work."""
    if name in DEFINED[kind]:
        return DEFINED[kind][name]
    module_name, _, attr = name.partition(":")
    if not module_name or not attr:
        raise ConfigError(kind, name, "an import path package.module:function, e.g. "
                                      f"mymodels:build, to {_CONTRACT[kind]}")
    try:
        module = _import(module_name)
    except Exception as exc:  # noqa: BLE001 - whatever the user's module raises, said in one line
        raise ConfigError(kind, name, f"module {module_name!r} does not import "
                                      f"({type(exc).__name__}: {exc}); put it on PYTHONPATH, in "
                                      "the working directory, or install it") from None
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ConfigError(kind, name, f"module {module_name!r} has no {attr!r}; name "
                                          f"{_CONTRACT[kind]} defined there")
        target = getattr(target, part)
    if not callable(target):
        raise ConfigError(kind, name, f"{attr!r} is a {type(target).__name__}, not {_CONTRACT[kind]}")
    _check_arguments(kind, name, target)
    return target


def _check_arguments(kind: Kind, name: str, function: Callable[..., Any]) -> None:
    """ConfigError where ``function`` cannot be called as its kind is (``_ARGUMENTS``): the
    signature it has beside the one it needs, before a run calls it (a TypeError's traceback on
    every rank, otherwise). A callable whose signature Python cannot read is taken as it is."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*_ARGUMENTS[kind])
    except TypeError:
        what = getattr(function, "__name__", type(function).__name__)
        raise ConfigError(kind, name, f"it is {what}{signature}, which cannot be called with "
                                      f"({', '.join(_ARGUMENTS[kind])}); give {_CONTRACT[kind]}") from None


def _import(module_name: str):
    """The module; a file in the working directory counts, as under ``python -m``."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name.split(".")[0] or os.getcwd() in sys.path:
            raise
        sys.path.append(os.getcwd())
        return importlib.import_module(module_name)


#: Hashes computed where the code was resolved and sent with it (``shipped``): an engine that
#: received a function by value reports the hash its sender saw, not one of its own.
HASHES: dict[tuple[Kind, str], str] = {}


def source_hash(kind: Kind, name: str) -> str:
    """The first 12 hex digits of the sha256 of the code ``name`` runs: the whole module of an
    import path, the function's (or class's) own source for a registered name."""
    if (kind, name) in HASHES:
        return HASHES[kind, name]
    function = resolve(kind, name)
    try:
        if name in DEFINED[kind]:
            source = inspect.getsource(function)
        else:
            source = inspect.getsource(sys.modules[name.partition(":")[0]])
    except (OSError, TypeError):  # defined where no source is kept: hash its code instead
        import cloudpickle

        return hashlib.sha256(cloudpickle.dumps(function)).hexdigest()[:12]
    return hashlib.sha256(source.encode()).hexdigest()[:12]


def check(model: str, dataset: str) -> None:
    """Resolve each of the two that is user code (its module imported, its signature read):
    ConfigError now, once, where a study would otherwise fail every run alike."""
    for kind, name in (("model", model), ("dataset", dataset)):
        if is_user_code(kind, name):
            resolve(kind, name)


def provenance(model: str, dataset: str) -> dict[str, str]:
    """What a run's summary records of the user's code (nothing for built-ins)."""
    out = {}
    for kind, name in (("model", model), ("dataset", dataset)):
        if is_user_code(kind, name):
            out[f"{kind}_source_sha256"] = source_hash(kind, name)
    return out


def shipped(model: str, dataset: str) -> bytes | None:
    """The user's functions of this run, pickled by value for a cluster's engines (``receive``);
    None when the run uses built-ins only."""
    functions = {}
    for kind, name in (("model", model), ("dataset", dataset)):
        if is_user_code(kind, name):
            functions[kind, name] = resolve(kind, name)
    if not functions:
        return None
    import cloudpickle

    for function in functions.values():  # by value: the engines need not import the module
        module = sys.modules.get(getattr(function, "__module__", ""))
        if module is not None and module.__name__ not in ("__main__", "builtins") \
                and not module.__name__.startswith("downpour_lib"):
            cloudpickle.register_pickle_by_value(module)
    try:
        return cloudpickle.dumps({key: (function, source_hash(*key))
                                  for key, function in functions.items()})
    finally:
        for function in functions.values():
            module = sys.modules.get(getattr(function, "__module__", ""))
            if module is not None:
                try:
                    cloudpickle.unregister_pickle_by_value(module)
                except ValueError:
                    pass


#: The file ``downpour train`` reads functions from before its config (``receive_file``): how a
#: study under mpiexec hands its ranks functions defined in a notebook.
SHIPPED_ENV = "DOWNPOUR_USER_CODE"


def receive_file(path: str | None) -> None:
    """``receive`` what ``shipped`` wrote to ``path`` (nothing when None or empty)."""
    if path:
        with open(path, "rb") as f:
            receive(f.read())


def receive(blob: bytes | None) -> None:
    """On an engine: the functions ``shipped`` sent, under their names."""
    if blob is None:
        return
    import cloudpickle

    for (kind, name), (function, digest) in cloudpickle.loads(blob).items():
        DEFINED[kind][name] = function
        HASHES[kind, name] = digest
