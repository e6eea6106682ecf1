"""TrainConfig: every impossible value fails on construction, naming the field, value and a fix."""

import json
import warnings

import pytest

from downpour_lib.algorithms import ALGORITHMS
from downpour_lib.config import TrainConfig
from downpour_lib.errors import ConfigError


@pytest.mark.parametrize("changes, field, hint", [
    ({"algorithm": "nope"}, "algorithm",
     "dpsgd, easgd, easgd_async, local, localsgd, osgp, sgp, slowmo, sync_ps"),
    ({"model": "alexnet"}, "model", "lenet"),
    ({"dataset": "imagenet"}, "dataset", "synthetic-imagenet"),
    ({"batch_size": 0}, "batch_size", ">= 1"),
    ({"lr": -0.1}, "lr", "> 0"),
    ({"lr": 0}, "lr", "> 0"),
    ({"momentum": 1.0}, "momentum", "[0, 1)"),
    ({"weight_decay": -1}, "weight_decay", ">= 0"),
    ({"steps": 10, "epochs": 1}, "steps", "not both"),
    ({"steps": 0}, "steps", ">= 1"),
    ({"epochs": 0}, "epochs", "> 0"),
    ({"steps": 5, "warmup_steps": 5}, "warmup_steps", "less than steps=5"),
    ({"optimizer": "lbfgs"}, "optimizer", "sgd, adam, adamw, adagrad"),
    ({"backend": "ucc"}, "backend", "auto, gloo, nccl, mpi"),
    ({"eval_every": -1}, "eval_every", ">= 0"),
    ({"timeout_s": 0}, "timeout_s", "> 0"),
    ({"algorithm": "sync_ps", "options": {"server": "remote"}}, "server", "dedicated"),
    ({"algorithm": "ddp", "options": {"server": "dedicated"}}, "server", "bucket_cap_mb"),
    ({"algorithm": "ddp", "options": {"bucket_cap_mb": 0}}, "bucket_cap_mb", "> 0"),
    # not finite: trains to a nan loss, or overflows when converted to steps, bytes or a timedelta
    ({"lr": float("inf")}, "lr", "finite number > 0"),
    ({"lr": float("nan")}, "lr", "finite number > 0"),
    ({"momentum": float("nan")}, "momentum", "[0, 1)"),
    ({"momentum": float("-inf")}, "momentum", "[0, 1)"),
    ({"weight_decay": float("inf")}, "weight_decay", "finite number >= 0"),
    ({"weight_decay": float("nan")}, "weight_decay", "finite number >= 0"),
    ({"epochs": float("inf")}, "epochs", "finite number > 0"),
    ({"epochs": float("nan")}, "epochs", "finite number > 0"),
    ({"timeout_s": float("inf")}, "timeout_s", "finite number of seconds > 0"),
    ({"timeout_s": float("nan")}, "timeout_s", "finite number of seconds > 0"),
    ({"startup_timeout_s": 0}, "startup_timeout_s", "finite number of seconds > 0, e.g. 300"),
    ({"startup_timeout_s": float("inf")}, "startup_timeout_s", "finite number of seconds > 0"),
    ({"algorithm": "ddp", "options": {"bucket_cap_mb": float("inf")}}, "bucket_cap_mb", "finite"),
    ({"algorithm": "allreduce", "options": {"bucket_cap_mb": float("nan")}}, "bucket_cap_mb",
     "finite number of MB > 0"),
    ({"algorithm": "allreduce", "options": {"accumulation_steps": 0}}, "accumulation_steps",
     "whole number >= 1 (1 = no accumulation)"),
    ({"algorithm": "downpour", "options": {"max_staleness": -1}}, "max_staleness",
     "whole number of updates >= 0 (or none for no bound)"),
])
def test_invalid_values_name_field_value_and_fix(changes, field, hint):
    with pytest.raises(ConfigError) as err:
        TrainConfig(**changes)
    assert err.value.field == field
    message = str(err.value)
    assert message.startswith(f"{field}=") and hint in message, message


def test_defaults_are_valid_and_frozen():
    import dataclasses

    config = TrainConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.optim.lr = 1.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.model = "lenet"  # type: ignore[misc]
    assert config.options.server == "auto"


def test_from_dict_converts_only_what_loses_nothing():
    config = TrainConfig.from_dict({"algorithm": "sync_ps", "batch_size": 64.0, "lr": 1,
                                    "steps": 7, "epochs": None, "options": {"servers": 1.0}})
    assert (config.data.batch_size, config.optim.lr) == (64, 1.0)
    assert (config.length.steps, config.length.epochs) == (7, None)
    assert type(config.data.batch_size) is int and type(config.optim.lr) is float
    assert config.options.servers == 1 and type(config.options.servers) is int


def test_from_dict_rejects_unknown_fields_and_bad_types():
    with pytest.raises(ConfigError, match="did you mean batch_size[?] choose one of .*batch_size"):
        TrainConfig.from_dict({"batchsize": 3})
    with pytest.raises(ConfigError, match="batch_size='many'.*must be an integer, not a string$"):
        TrainConfig.from_dict({"batch_size": "many"})


@pytest.mark.parametrize("values, says", [
    ({"lr": "fast"}, "lr='fast' is not valid: must be a number, not a string"),
    ({"momentum": "0.9"}, "momentum='0.9' is not valid: must be a number, not a string: write 0.9 "
                          "without quotes"),
    ({"steps": "10"}, "steps='10' is not valid: must be an integer, not a string: write 10 without "
                      "quotes"),
    ({"batch_size": 2.5}, "batch_size=2.5 is not valid: must be an integer"),
    ({"final_eval": 1}, "final_eval=1 is not valid: must be true or false"),
])
def test_pythons_own_values_are_checked_as_a_files_are(values, says):
    """TrainConfig(steps="10") ended in a TypeError naming no field, and batch_size=2.5 was taken
    here and refused on a cluster's engines, once a rank."""
    with pytest.raises(ConfigError) as error:
        TrainConfig(algorithm="sync_ps", **values)
    assert str(error.value) == says
    assert TrainConfig(steps=10.0, lr=1).length.steps == 10  # what loses nothing is converted
    assert isinstance(TrainConfig(lr=1).optim.lr, float)
    with pytest.raises(TypeError, match="unexpected keyword argument 'stpes'; did you mean steps[?]"):
        TrainConfig(stpes=20)


@pytest.mark.parametrize("key, says", [
    ("period", "config field='period' is not valid: an option of localsgd, easgd, easgd_async, diloco, "
               "slowmo: a file gives it under options, e.g. options: {period: ...}"),
    ("batch-size", "config field='batch-size' is not valid: a file spells it batch_size"),
    ("summary_json", "config field='summary_json' is not valid: a flag of downpour train alone: give "
                     "--summary-json on its command line"),
])
def test_a_config_files_key_that_is_a_flag_says_where_it_goes(key, says):
    """What a user who knows the flags writes in a file: an option at the top, a flag's spelling,
    a flag that is no field; each named with its fix. The flags named are train's."""
    with pytest.raises(ConfigError) as error:
        TrainConfig.from_dict({"algorithm": "localsgd", key: 2})
    assert str(error.value) == says
    from downpour_lib.cli import build_parser
    from downpour_lib.config import FLAGS_ONLY

    train = build_parser("train").parse_args(["train", "--config", "c.yaml", "--summary-json", "s.json",
                                              "--preflight"])
    assert all(hasattr(train, flag) for flag in FLAGS_ONLY)


@pytest.mark.parametrize("values, message", [
    ({"steps": "10"}, "steps='10' is not valid: must be an integer, not a string: write 10 without "
                      "quotes"),
    ({"steps": 10.5}, "steps=10.5 is not valid: must be an integer"),
    ({"steps": True}, "steps=True is not valid: must be an integer"),
    ({"lr": "0.1"}, "lr='0.1' is not valid: must be a number, not a string: write 0.1 without quotes"),
    ({"lr": "inf"}, "lr='inf' is not valid: must be a number, not a string"),
    ({"epochs": "none"}, "epochs='none' is not valid: must be a number, not a string"),
    ({"algorithm": "sync_ps", "options": {"servers": "2"}},
     "servers='2' is not valid: must be an integer, not a string: write 2 without quotes"),
])
def test_config_files_give_numbers_not_strings(tmp_path, values, message):
    (tmp_path / "c.json").write_text(json.dumps(values))
    with pytest.raises(ConfigError) as err:
        TrainConfig.from_file(tmp_path / "c.json")
    assert str(err.value) == message


def test_yaml_reads_exponents_as_numbers(tmp_path):
    (tmp_path / "c.yaml").write_text("lr: 1e-3\nweight_decay: 5E-4\nsteps: 1e2\n")
    config = TrainConfig.from_file(tmp_path / "c.yaml")  # PyYAML alone reads 1e-3 as a string
    assert (config.optim.lr, config.optim.weight_decay, config.length.steps) == (0.001, 0.0005, 100)
    (tmp_path / "d.yaml").write_text("steps: '10'\n")
    with pytest.raises(ConfigError, match="steps='10' is not valid: must be an integer, not a str"):
        TrainConfig.from_file(tmp_path / "d.yaml")


def test_round_trip_through_yaml_and_json(tmp_path):
    config = TrainConfig(algorithm="sync_ps", model="lenet", steps=9, options={"server": "dedicated"})
    (tmp_path / "c.json").write_text(json.dumps(config.to_dict()))
    assert TrainConfig.from_file(tmp_path / "c.json") == config
    (tmp_path / "c.yaml").write_text("algorithm: sync_ps\nmodel: lenet\nsteps: 9\n"
                                     "options: {server: dedicated}\n")
    assert TrainConfig.from_file(tmp_path / "c.yaml") == config
    # flags given on top of a file win
    assert TrainConfig.from_file(tmp_path / "c.yaml", steps=3).length.steps == 3


def test_files_cannot_give_non_finite_numbers(tmp_path):
    (tmp_path / "c.yaml").write_text("lr: .inf\n")
    with pytest.raises(ConfigError, match=r"^lr=inf is not valid: must be a finite number > 0"):
        TrainConfig.from_file(tmp_path / "c.yaml")
    (tmp_path / "c.json").write_text('{"lr": 0.1, "weight_decay": NaN}')  # Python's json reads NaN
    with pytest.raises(ConfigError, match=r"^weight_decay=nan is not valid: must be a finite"):
        TrainConfig.from_file(tmp_path / "c.json")


def test_bad_config_files(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        TrainConfig.from_file(tmp_path / "missing.yaml")
    (tmp_path / "c.toml").write_text("")
    with pytest.raises(ConfigError, match=".yaml, .yml or .json"):
        TrainConfig.from_file(tmp_path / "c.toml")


def test_world_size_checks():
    with pytest.raises(ConfigError, match="local.*3 ranks"):
        TrainConfig(algorithm="local").options.roles(3)
    with pytest.raises(ConfigError, match="workers=2 .*exactly 1 worker"):
        TrainConfig(algorithm="local").options.roles_for(2)
    with pytest.raises(ConfigError, match="dedicated server needs at least 2 ranks"):
        TrainConfig(algorithm="sync_ps", options={"server": "dedicated"}).options.roles(1)
    for algorithm in ALGORITHMS:  # every algorithm runs in a world of one
        if algorithm == "easgd_async":  # but this one, whose center is a rank of its own
            with pytest.raises(ConfigError, match="easgd_async needs a server rank"):
                TrainConfig(algorithm=algorithm).options.roles(1)
            continue
        roles = TrainConfig(algorithm=algorithm).options.roles(1)
        assert roles.workers == (0,) and roles.evaluator == 0, algorithm
    for algorithm in ALGORITHMS:  # and, but for local, with 4 workers as asked
        if algorithm != "local":
            roles = TrainConfig(algorithm=algorithm).options.roles_for(4)
            assert len(roles.workers) == 4 and roles.world_size >= 4, algorithm


def test_every_algorithm_takes_its_options_from_the_registry_the_config_reads():
    """The config, the command line and the performance model read ``options.OPTIONS`` (no
    torch); the engine builds ``algorithms.ALGORITHMS``: the same names, the same classes."""
    from downpour_lib.options import OPTIONS

    assert list(OPTIONS) == list(ALGORITHMS)
    for name, cls in ALGORITHMS.items():
        assert cls.name == name and cls.Options is OPTIONS[name], name
        assert type(TrainConfig(algorithm=name).options) is OPTIONS[name]


def test_every_whole_number_option_refuses_a_bool_and_a_fraction():
    """The config's coercion refuses them, but the options classes are public too:
    ``AllReduceOptions(accumulation_steps=True)`` (True == 1 to Python) and ``SGPOptions(
    peers_per_step=2.5)`` were accepted until the checks were one helper
    (``options.base.check_whole``). Every int-typed option of every algorithm refuses both, in
    the options class itself and through the config, naming the field."""
    import dataclasses
    import typing

    from downpour_lib.options import OPTIONS

    checked = 0
    for name, cls in OPTIONS.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if hints[f.name] not in (int, int | None):
                continue
            for bad in (True, 2.5):
                with pytest.raises(ConfigError) as direct:
                    cls(**{f.name: bad})
                with pytest.raises(ConfigError) as configured:
                    TrainConfig(algorithm=name, options={f.name: bad})
                assert direct.value.field == configured.value.field == f.name, (name, f.name, bad)
            checked += 1
    assert checked >= 10  # servers, n_fetch, n_push, warmstart, period, max_lag, ...


def test_pointless_momentum_warns():
    with pytest.warns(UserWarning, match="momentum=0.9 has no effect"):
        TrainConfig(optimizer="adam", momentum=0.9)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TrainConfig(optimizer="adam", momentum=0.0)


# -- sections ---------------------------------------------------------------------------------

def test_sections_hold_every_field_once_and_write_flat():
    from downpour_lib.config import SECTION_OF, SECTIONS, TOP

    config = TrainConfig(algorithm="ddp", batch_size=64, lr=0.1, steps=9, threads=1,
                         checkpoint_dir="ck", preempt_signal="none", slow_workers=1, slowdown=2.0)
    flat = config.to_dict()
    assert len(flat) == 45 and set(flat) == set(TOP) | set(SECTION_OF)
    for name, section in SECTION_OF.items():
        dotted = getattr(getattr(config, section), name)
        assert flat[name] == (list(dotted) if isinstance(dotted, tuple) else dotted)
    assert (config.data.batch_size, config.optim.lr, config.length.steps) == (64, 0.1, 9)
    assert config.system.threads == 1 and config.outputs.checkpoint_dir == "ck"
    assert config.runtime.preempt_signal == "none" and config.emulation.slowdown == 2.0
    assert set(SECTIONS) == {"data", "optim", "length", "system", "emulation", "outputs",
                             "runtime"}


def test_flat_names_build_replace_and_round_trip_a_sectioned_config():
    import dataclasses

    from downpour_lib.config import Data

    config = TrainConfig(algorithm="sync_ps", batch_size=16, epochs=0.5)
    again = dataclasses.replace(config, batch_size=8)  # a flat name, as notebooks write it
    assert again.data.batch_size == 8 and again.length.epochs == 0.5 and again.optim == config.optim
    assert config.replace(batch_size=8) == again
    assert TrainConfig.from_dict(config.to_dict()) == config
    whole = TrainConfig(data=Data(dataset="synthetic-mnist", batch_size=4), seed=3)
    assert (whole.data.dataset, whole.data.batch_size, whole.data.seed) == ("synthetic-mnist", 4, 3)
    with pytest.raises(TypeError, match="batchsize"):
        TrainConfig(batchsize=3)
    with pytest.raises(ConfigError) as err:
        TrainConfig(data={"batch_size": 4})
    assert err.value.field == "data" and "Data" in str(err.value)


def test_each_section_validates_its_own_fields():
    from downpour_lib.config import Data, Emulation, Length, Optim, Outputs, System

    for section, values, name in [(Data, {"batch_size": 0}, "batch_size"),
                                  (Optim, {"lr": -1.0, "optimizer": "sgd", "momentum": 0.0}, "lr"),
                                  (Length, {"steps": 3, "warmup_steps": 3}, "warmup_steps"),
                                  (System, {"timeout_s": 0.0}, "timeout_s"),
                                  (Emulation, {"slowdown": 0.5}, "slowdown"),
                                  (Outputs, {"keep_checkpoints": 0}, "keep_checkpoints")]:
        with pytest.raises(ConfigError) as err:
            section(**values)
        assert err.value.field == name


def test_identity_is_every_section_but_outputs_and_runtime():
    """What a study takes for the same run: changing where it writes or how it is stopped keeps
    the identity; changing any other field (of any section) changes it."""
    from downpour_lib.config import SECTION_OF
    from downpour_lib.study.core import run_id

    base = TrainConfig(algorithm="allreduce", steps=10, checkpoint_dir="a")
    same = base.replace(output_dir="o", trace="t", checkpoint_dir="b", checkpoint_every=2,
                        keep_checkpoints=5, preempt_signal="none", requeue=False)
    assert same.identity() == base.identity()
    assert run_id(same, 2, 0) == run_id(base, 2, 0)
    left_out = {k for k, section in SECTION_OF.items() if section in ("outputs", "runtime")}
    assert set(base.to_dict()) - set(base.identity()) == left_out
    for changes in ({"batch_size": 8}, {"lr": 0.2}, {"steps": 11}, {"backend": "gloo"},
                    {"threads": 2}, {"slow_workers": 1}, {"seed": 1}, {"model": "lenet"}):
        assert run_id(base.replace(**changes), 2, 0) != run_id(base, 2, 0), changes


#: The hand-kept lists checkpoint.py held before each field declared its rule (SAME_RUN, NOT_THE_RUN).
OLD_KEEP = {"algorithm", "options", "model", "dataset", "batch_size", "seed", "optimizer",
            "lr_schedule", "lr_warmup_epochs", "lr_milestones", "lr_decay", "lr_scaling",
            "precision", "augment"}
OLD_NOT_THE_RUN = {"steps", "epochs", "eval_every", "eval_batch_size", "final_eval", "threads",
                   "data_workers", "warmup_steps", "timeout_s", "output_dir", "checkpoint_dir",
                   "checkpoint_every", "resume", "preempt_signal", "requeue", "trace", "data_dir",
                   "backend", "device", "keep_checkpoints",
                   "startup_timeout_s", "eval_samples"}  # and fields added since, not the run either


def test_every_config_field_declares_its_identity_rule():
    """A field added without saying whether it makes a run the same run is refused (by name),
    and every field has one of the four rules."""
    import dataclasses

    from downpour_lib.config import IDENTITY, IDENTITY_RULES, _help, identity_rules

    fields = TrainConfig.flat_fields()
    assert set(IDENTITY) == set(fields) and len(fields) == 45
    for name, f in fields.items():
        assert f.metadata.get("identity") in IDENTITY_RULES, name

    @dataclasses.dataclass(frozen=True)
    class New:
        ruled: int = _help("declares one", identity="match", default=0)
        unruled: int = _help("declares none", default=0)
        misspelt: int = _help("declares a word no rule is", identity="same", default=0)

    for name in ("unruled", "misspelt"):
        with pytest.raises(TypeError, match=f"config field {name!r} declares identity="):
            identity_rules(f for f in dataclasses.fields(New) if f.name in ("ruled", name))
    assert identity_rules(f for f in dataclasses.fields(New) if f.name == "ruled") == {"ruled": "match"}


def test_declared_rules_give_what_the_hand_kept_lists_did():
    """keep = checkpoint's old SAME_RUN; match = every field but its old NOT_THE_RUN (what resume
    auto and pruning compared); measure = a study's identity, every section but outputs and
    runtime; each rule's fields are held by every looser one."""
    from downpour_lib.config import IDENTITY, SECTION_OF, held_to

    keep, match, measure = (set(held_to(rule)) for rule in ("keep", "match", "measure"))
    assert keep == OLD_KEEP
    assert match == set(IDENTITY) - OLD_NOT_THE_RUN
    assert match - keep == {"lr", "momentum", "weight_decay", "lr_reference_batch", "channels_last",
                            "slow_workers", "slowdown", "compute", "emulated_step_s"}
    assert measure == {k for k in IDENTITY if SECTION_OF.get(k) not in ("outputs", "runtime")}
    assert keep < match < measure < set(IDENTITY)
    assert set(held_to("free")) == set(IDENTITY)
    config = TrainConfig(algorithm="allreduce", steps=10)
    assert set(config.identity()) == measure


def test_slurm_resume_is_one_rule(monkeypatch):
    config = TrainConfig(checkpoint_dir="ck")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert config.slurm_resume() is config  # outside a Slurm job
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    assert config.slurm_resume().outputs.resume == "auto"
    assert config.slurm_resume(named=True) is config  # --resume none on the command line
    assert TrainConfig().slurm_resume().outputs.resume is None  # no checkpoint_dir: nothing
    never = TrainConfig(checkpoint_dir="ck", resume="never")
    assert never.slurm_resume() is never


def test_rename_map_turns_flat_reads_into_dotted_ones(tmp_path):
    """The sed script handed to whoever merges code written for the flat config."""
    import subprocess

    from downpour_lib.config import SECTION_OF, rename_script

    script = tmp_path / "rename.sed"
    script.write_text(rename_script())
    code = tmp_path / "x.py"
    code.write_text("a = config.batch_size + cfg.lr + self.config.lr_schedule\n"
                    "b = config.data.batch_size, replace(config, steps=3)\n"
                    + "".join(f"z = config.{name}\n" for name in SECTION_OF))
    subprocess.run(["sed", "-E", "-i", "-f", str(script), str(code)], check=True)
    subprocess.run(["sed", "-E", "-i", "-f", str(script), str(code)], check=True)  # idempotent
    lines = code.read_text().splitlines()
    assert lines[0] == "a = config.data.batch_size + cfg.optim.lr + self.config.optim.lr_schedule"
    assert lines[1] == "b = config.data.batch_size, replace(config, steps=3)"
    assert lines[2:] == [f"z = config.{s}.{n}" for n, s in SECTION_OF.items()]


# -- flat reads: deprecated, and none left in the library, its tests or the notebooks ---------

def test_a_flat_read_warns_naming_its_line_and_reads_the_section():
    from downpour_lib.config import SECTION_OF

    config = TrainConfig(algorithm="ddp", batch_size=64, lr=0.1, steps=9, checkpoint_dir="ck",
                         slowdown=2.0, slow_workers=1)
    with pytest.warns(DeprecationWarning, match=r"^config\.batch_size is config\.data\.batch_size; "
                                                r"read it through its section$") as seen:
        assert config.batch_size == 64  # flat, on purpose
    assert [(w.filename, w.lineno) for w in seen] == [(__file__, seen[0].lineno)]  # the reader's
    for name, section in SECTION_OF.items():
        with pytest.warns(DeprecationWarning, match=rf"^config\.{name} is config\.{section}\.{name};"):
            assert getattr(config, name) == getattr(getattr(config, section), name)


def test_the_suite_fails_a_flat_read():
    """pyproject's filterwarnings: a flat read the library or a test makes is an error here."""
    with pytest.raises(DeprecationWarning, match="config.lr is config.optim.lr"):
        _ = TrainConfig().lr  # flat, on purpose


#: A TrainConfig reached by a name: these names and attributes, a name annotated TrainConfig
#: (or TrainConfig | None), or one assigned a TrainConfig(...), TrainConfig.from_dict/from_file
#: (...) or another's .replace/.slurm_resume(...) in the same function.
CONFIG_NAMES = {"config", "cfg"}
CONFIG_ATTRIBUTES = {"config", "_config", "cfg"}
CONFIG_HINTS = {"TrainConfig", "TrainConfig | None", "Optional[TrainConfig]"}
ON_PURPOSE = "# flat, on purpose"  # a line that reads flat to test the flat read


def _is_config(node, names: set[str]) -> bool:
    import ast

    if isinstance(node, ast.Name):
        return node.id in names
    if isinstance(node, ast.Attribute):
        return node.attr in CONFIG_ATTRIBUTES
    if isinstance(node, ast.Call):
        f = node.func
        if isinstance(f, ast.Name):
            return f.id == "TrainConfig"
        if isinstance(f, ast.Attribute):
            return (f.attr in ("from_dict", "from_file") and ast.unparse(f.value) == "TrainConfig"
                    or f.attr in ("replace", "slurm_resume") and _is_config(f.value, names))
    return False


def _scope(node):
    """The nodes of a module or function, a function's nested ones included (they see its
    names), a module's functions left out (each is its own scope)."""
    import ast

    yield node
    for child in ast.iter_child_nodes(node):
        if not (isinstance(node, ast.Module) and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))):
            yield from _scope(child)


def _config_names(scope: list) -> set[str]:
    import ast

    names = set(CONFIG_NAMES)
    for node in scope:
        if isinstance(node, ast.arg) and node.annotation is not None \
                and ast.unparse(node.annotation).strip("'\"") in CONFIG_HINTS:
            names.add(node.arg)
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                and ast.unparse(node.annotation).strip("'\"") in CONFIG_HINTS:
            names.add(node.target.id)
    for _ in range(3):  # a name assigned from a name assigned a config
        for node in scope:
            if isinstance(node, ast.Assign) and _is_config(node.value, names):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def flat_reads(source: str) -> list[str]:
    """Each ``line: expression`` in ``source`` that reads a config field flat: an attribute load,
    or getattr/hasattr with the field's name written out, on a TrainConfig (``_is_config``)."""
    import ast

    from downpour_lib.config import SECTION_OF

    tree = ast.parse(source)
    lines = source.splitlines()
    found = set()
    for top in [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]:
        scope = list(_scope(top))
        names = _config_names(scope)
        for node in scope:
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                hit = node.attr in SECTION_OF and _is_config(node.value, names)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                args = node.args
                hit = (node.func.id in ("getattr", "hasattr") and len(args) >= 2
                       and isinstance(args[1], ast.Constant) and args[1].value in SECTION_OF
                       and _is_config(args[0], names))
            else:
                continue
            if hit and not lines[node.lineno - 1].endswith(ON_PURPOSE):
                found.add((node.lineno, ast.unparse(node)))
    return [f"{line}: {text}" for line, text in sorted(found)]


def test_the_walk_finds_flat_reads_where_they_are():
    source = """
def f(config, plan, c: TrainConfig, d: "TrainConfig | None", run):
    a = config.data.batch_size + config.batch_size
    b = plan.config.steps, c.lr, d.seed, run.config.length.steps, getattr(config, "device")
    e = TrainConfig(steps=3).steps
    g = c.replace(steps=4)
    h = g.steps, c.options.period, c.model
    i = config.lr  # flat, on purpose
    config.steps = 3

def other(c, rows):
    return c.lr, rows.steps  # an unknown c and rows: not a config
"""
    assert flat_reads(source) == [
        "3: config.batch_size", "4: c.lr", "4: d.seed", "4: getattr(config, 'device')",
        "4: plan.config.steps", "5: TrainConfig(steps=3).steps", "7: g.steps"]


def test_no_flat_read_is_left_in_the_library_its_tests_or_the_notebooks():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    found = []
    for path in sorted([*(root / "downpour_lib").rglob("*.py"), *(root / "tests").rglob("*.py")]):
        found += [f"{path.relative_to(root)}:{hit}" for hit in flat_reads(path.read_text())]
    for path in sorted((root / "notebooks").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(path.read_text())["cells"]):
            if cell["cell_type"] == "code":  # IPython's magics and shell lines are not Python
                code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line
                                 for line in "".join(cell["source"]).splitlines())
                found += [f"{path.name} cell {i}:{hit}" for hit in flat_reads(code)]
    assert not found, "read these through their section (config.data.batch_size):\n" + "\n".join(found)
