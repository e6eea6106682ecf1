"""The command line: bad input exits 2 naming field, value and fix; good input trains."""

import json
import os
import subprocess
import sys
import typing
from typing import Literal

import pytest
from conftest import BIN, ROOT, downpour, explain, launch_env, mpiexec, read_json

from downpour_lib.algorithms import ALGORITHMS
from downpour_lib.cli import build_parser, main
from downpour_lib.cli.train import config_from_args

ALGORITHM_NAMES = ", ".join(sorted(ALGORITHMS))  # every registered one, as the error lists them


#: Every bad input tried on `downpour train`, as a new user would: (flags, what stderr must say,
#: exit status). {tmp} is a fresh directory, {file} a file in it, {yaml} a config file with a YAML
#: syntax error on line 2, {json} one with a JSON syntax error. The list grows with the code.
BAD_INPUTS = [
    (["--algorithm", "nope"], f"algorithm='nope' is not valid: choose one of {ALGORITHM_NAMES}", 2),
    (["--batch-size", "0"], "batch_size=0", 2),
    (["--lr", "-1"], "lr=-1.0", 2),
    (["--lr", "inf"], "lr=inf is not valid: must be a finite number > 0", 2),
    (["--lr", "nan"], "lr=nan is not valid: must be a finite number > 0", 2),
    (["--weight-decay", "inf"], "weight_decay=inf is not valid: must be a finite number >= 0", 2),
    (["--algorithm", "allreduce", "--bucket-cap-mb", "inf"], "bucket_cap_mb=inf is not valid", 2),
    (["--steps", "5", "--epochs", "1"], "give steps or epochs, not both", 2),
    # a 2-step smoke run meets a default it never set: the line says it is one, and the fix
    (["--steps", "2"], "warmup_steps=2 is not valid: must be less than steps=2, or throughput has "
     "no measured step: give more steps, or a warmup_steps of your own (the first steps left out "
     "of throughput; this is its default): e.g. --warmup-steps 0", 2),
    (["--model", "vgg16"], "vgg16 needs images at least 32x32; the data set gives 8x8", 2),
    (["--algorithm", "sync_ps", "--server", "dedicated"], "dedicated server needs at least 2 ranks", 2),
    (["--algorithm", "sync_ps", "--bucket-cap-mb", "5"],
     "has no such option; it is an option of ddp, allreduce (its options: server, servers)", 2),
    (["--algorithm", "localsgd", "--moving-rate", "0.1"],
     "moving_rate=0.1 is not valid: algorithm 'localsgd' has no such option; it is an option of "
     "easgd, easgd_async (its options: period, sync_steps)", 2),
    # the retired spelling of asynchronous EASGD: one line that names the algorithm it is now
    (["--algorithm", "easgd", "--mode", "async"],
     "mode='async' is not valid: easgd is synchronous EASGD; asynchronous EASGD is its own "
     "algorithm, easgd_async", 2),
    (["--algorithm", "easgd_async"], "easgd_async needs a server rank and at least one worker", 2),
    (["--batch-size", "lots"], "batch_size='lots'", 2),
    (["--dataset", "mnist", "--data-dir", "/nonexistent/x"], "/nonexistent/x/MNIST/raw", 2),
    (["--output-dir", "{file}"], "output_dir='{file}' is not valid: is a file, and a directory is wanted", 2),
    # a file that is not a checkpoint: the flag given is named, not the checkpoint_dir it defaults
    (["--resume", "{file}"], "resume='{file}' is not valid: is a file and not a checkpoint", 2),
    (["--checkpoint-dir", "{file}/ckpt"], "checkpoint_dir='{file}/ckpt' is not valid: cannot be created: "
                                         "{file} is a file, not a directory", 2),
    (["--summary-json", "{tmp}"],
     "summary_json='{tmp}' is not valid: is a directory, and a file is wanted", 2),
    (["--summary-json", "{file}/s.json"], "summary_json='{file}/s.json' is not valid: cannot be created", 2),
    # a summary is never overwritten (a restarted sandbox gave job id 1 again: downpour-1.json)
    (["--summary-json", "{file}"], "summary_json='{file}' is not valid: exists: another run's", 2),
    (["--config", "{yaml}"], "config='{yaml}' is not valid: line 2, column 8: mapping values are not "
                             "allowed here", 2),
    (["--config", "{json}"], "config='{json}' is not valid: line 1, column 13: Expecting property name", 2),
    # other commands: a row starting with a command word runs that command instead of train
    (["notebook", "run", "{tmp}/nope.ipynb"],
     "notebook='{tmp}/nope.ipynb' is not valid: no such file: give a notebook", 2),
    (["notebook", "run", "{json}"], "notebook='{json}' is not valid: not a Jupyter notebook", 2),
    (["notebook", "run", "{nb}", "-p", "workers=[1,"],
     "parameter workers='[1,' is not valid: ", 2),
    (["notebook", "run", "{nb}", "-p", "profile='local-mpi"],
     "parameter profile=\"'local-mpi\" is not valid", 2),
    (["notebook", "run", "{nb}", "-p", "stepz=3"],
     "parameter='stepz' is not valid: the notebook's parameters are algorithms, workers", 2),
    (["notebook", "run", "{nb}", "-p", "algorithms=['nope']", "-p", "out={tmp}", "--no-save"],
     "downpour notebook: error: 02_scaling_study.ipynb: algorithms='nope' is not valid: choose "
     "from local, sync_ps", 2),
    (["model", "predict", "--model", "nope"], "model='nope' is not valid: choose one of ", 2),
    (["model", "nccl", "--preset", "dgx-a100", "--sizes", "8,4X"],
     "sizes='4X' is not valid: sizes are bytes with an optional K, M or G suffix", 2),
    (["model", "nccl", "--preset", "dgx-a100", "--csv", "{tmp}"], "is a directory, and a file", 2),
    (["model", "check", "--figure", "{tmp}/checks.txt"],
     "figure='{tmp}/checks.txt' is not valid: a file ending in .png, .pdf or .svg", 2),
    (["model", "check", "--figure", "{tmp}"], "figure='{tmp}' is not valid: is a directory", 2),
    (["model", "predict", "--model", "inception_small", "--algorithm", "allreduce,nope"],
     "algorithm='nope' is not valid: choose one of ", 2),
    # an option's value is checked by its algorithm's options, as a run's is (period=0 divided by
    # 0), and an option its algorithm does not have is named, not ignored
    (["model", "predict", "--preset", "horovod-pascal-25g", "--model", "vgg16", "--algorithm",
      "localsgd", "--option", "localsgd.period=0"],
     "period=0 is not valid: must be a whole number >= 1", 2),
    (["model", "spread", "{tmp}/none.csv"],
     "steps='{tmp}/none.csv' is not valid: no such file: `downpour train --output-dir DIR` writes", 2),
    (["model", "spread", "{tmp}/none.csv", "--warmup-steps", "-1"], "warmup_steps=-1 is not valid", 2),
    # a spread measured is a coefficient of variation, named with what would work
    (["model", "predict", "--preset", "horovod-pascal-25g", "--model", "vgg16", "--node-spread",
      "-0.1"], "node_spread=-0.1 is not valid: a coefficient of variation of the nodes' own speeds", 2),
    # SGP's workers are whole nodes of 8 V100s: 8 of them a node would be 64 GPUs a node
    (["model", "predict", "--preset", "sgp-v100-10g", "--model", "resnet50", "--devices-per-node",
      "8"], "devices_per_node=8 is not valid: 1: a worker of resnet50 is a whole node of 8 devices", 2),
    (["model", "predict", "--preset", "horovod-pascal-25g", "--model", "vgg16", "--algorithm",
      "localsgd", "--option", "localsgd.servers=4"],
     "option='localsgd.servers=4' is not valid: the model reads period, slow_workers, slowdown of "
     "localsgd", 2),
    (["model", "predict", "--model", "inception_small", "--calibration", "{tmp}/none.json"],
     "calibration='{tmp}/none.json' is not valid: no such file", 2),
    # a model the calibration has no compute for: the two commands that measure it, not a guess
    (["model", "predict", "--model", "resnet20", "--calibration", "{cal}"],
     "model='resnet20' is not valid: calibration 'measured-vm' ({cal}) has compute for "
     "inception_small only. Measure resnet20 on this machine: `downpour train --model resnet20 ", 2),
    # yours, misspelt: it does not import, which is said (not how to measure it)
    (["model", "predict", "--model", "nosuchmodule:build", "--calibration", "{cal}"],
     "model='nosuchmodule:build' is not valid: module 'nosuchmodule' does not import", 2),
    # the data set it names fits the model: cnn1d takes MNIST-1D's signals, not CIFAR's images
    (["model", "predict", "--model", "cnn1d", "--calibration", "{cal}"],
     "Measure cnn1d on this machine: `downpour train --model cnn1d --dataset mnist1d ", 2),
    # a model the preset has no rate for, downpour's or only a preset's: the presets that have
    # it, and the file to add it to (it was a KeyError's traceback)
    (["model", "predict", "--preset", "dgx-h100-ib400", "--model", "bert-large-128"],
     "model='bert-large-128' is not valid: preset 'dgx-h100-ib400' has compute for gpt2, resnet101, "
     "resnet50 only. Presets with bert-large-128: dgx-a100-bert, dgx-a100-bert-paddle, "
     "dgx-a100-bert-tf, dgx1-v100-32g-bert (--preset NAME). Or copy "
     "downpour_lib/perf/hardware/dgx-h100-ib400.yaml, add bert-large-128 under `models:`", 2),
    (["model", "predict", "--model", "bert-large-128", "--calibration", "{cal}"],
     "has compute for inception_small only. downpour does not train bert-large-128, so it cannot "
     "be measured here. Presets with bert-large-128: dgx-a100-bert, ", 2),
    (["model", "predict", "--model", "mine", "--hardware", "{hw}"],
     "model='mine' is not valid: hardware file 'sgp-v100-10g' ({hw}) has compute for resnet50 only. "
     "To predict it, add mine under `models:`", 2),
    (["model", "calibrate", "--collectives", "{coll}", "--summary", "{tmp}/none.json"],
     "summary='{tmp}/none.json' is not valid: no such file: write one with `downpour train", 2),
    (["model", "calibrate", "--collectives", "{coll}", "--summary", "{json}"],
     "summary='{json}' is not valid: not JSON", 2),
    (["model", "calibrate", "--collectives", "{coll}", "--summary", "{nb}"],
     "summary='{nb}' is not valid: lacks ['algorithm', 'batch_size', ", 2),
    # a path a command writes is checked before it runs, not at its end (a traceback after the
    # work: predict's rows, calibrate's fit, a study's runs)
    (["model", "predict", "--preset", "horovod-pascal-25g", "--model", "vgg16", "--json", "{tmp}"],
     "json='{tmp}' is not valid: is a directory, and a file is wanted here: give a file's path, "
     "e.g. {tmp}/rows.json", 2),
    (["model", "calibrate", "--collectives", "{coll}", "--out", "{tmp}"],
     "out='{tmp}' is not valid: is a directory, and a file is wanted", 2),
    (["model", "calibrate", "--collectives", "{coll}", "--steps", "{steps}", "--out", "{tmp}/c.json"],
     "steps='{steps}' is not valid: no step past the first 5 (the warm-up)", 2),
    (["study", "--out", "{file}", "--steps", "4", "--warmup-steps", "1"],
     "out='{file}' is not valid: is a file, and a directory is wanted", 2),
    (["plot", "--reference", "--figures", "{file}"],
     "figures='{file}' is not valid: is a file, and a directory is wanted", 2),
    # a file where the checkpoints should be: said, not watched until the timeout
    (["evaluate", "--checkpoint-dir", "{file}", "--watch", "--timeout-s", "30"],
     "checkpoint_dir='{file}' is not valid: is a file, and a directory is wanted", 2),
    # a misspelt built-in is the model's error, said by the verb, not a data set's
    (["model", "describe", "--model", "lenett"],
     "downpour model describe: error: model='lenett' is not valid: did you mean lenet? choose one "
     "of cnn1d", 2),
    (["evaluate", "--checkpoint-dir", "{tmp}", "--device", "gpu"],
     "device='gpu' is not valid: choose one of cpu, cuda, cuda:N (N a GPU's index) or auto", 2),
    (["evaluate", "--checkpoint-dir", "{tmp}", "--csv", "{tmp}"],
     "csv='{tmp}' is not valid: is a directory, and a file is wanted", 2),
    # validate's arguments, checked before any sandbox starts: 3 nodes and any model pass them
    (["model", "validate", "--nodes", "1"], "nodes=1 is not valid: at least 2", 2),
    (["model", "validate", "--model", "nope"], "model='nope' is not valid: choose one of cnn1d, ", 2),
    (["model", "validate", "--nodes", "3", "--model", "resnet20", "--dataset", "nope"],
     "dataset='nope' is not valid: choose one of ", 2),
    (["model", "validate", "--nodes", "3", "--model", "resnet20", "--algorithms", "sync_ps"],
     "algorithms='sync_ps' is not valid: one worker per node and no server rank", 2),
]
COMMANDS = ("notebook", "model", "study", "plot", "evaluate")


@pytest.mark.parametrize("args, expected, status", BAD_INPUTS,
                         ids=[" ".join(a)[:40] for a, _, _ in BAD_INPUTS])
def test_bad_input_exits_with_a_useful_message(capsys, tmp_path, args, expected, status):
    places = {"tmp": str(tmp_path), "file": str(tmp_path / "afile"), "yaml": str(tmp_path / "run.yaml"),
              "json": str(tmp_path / "run.json"),
              "nb": str(ROOT / "notebooks" / "02_scaling_study.ipynb"),
              "cal": str(ROOT / "results/reference/scaling/calibration.json"),
              "coll": str(ROOT / "results/reference/scaling/collectives.json"),
              "hw": str(ROOT / "downpour_lib/perf/hardware/sgp-v100-10g.yaml"),
              "steps": str(tmp_path / "steps.csv")}
    (tmp_path / "afile").write_text("")
    (tmp_path / "run.yaml").write_text("algorithm: local\n  steps: 3\n")
    (tmp_path / "run.json").write_text('{"steps": 3,}')
    (tmp_path / "steps.csv").write_text("step,step_s\n0,0.1\n1,0.1\n")  # warm-up steps alone
    argv = [a.format(**places) for a in args]
    assert main(argv if args[0] in COMMANDS else ["train", *argv]) == status
    err = capsys.readouterr().err
    assert expected.format(**places) in err and "Traceback" not in err
    assert "-------" not in err and "Kernel" not in err  # no dump of a notebook's cell


def test_every_output_a_command_checks_is_one_of_its_flags():
    """The dispatcher checks the paths each parser names (``output_files``, ``output_dirs``)
    before the command runs; a name that is no flag's dest would check nothing."""
    import argparse

    from downpour_lib.cli import build_parser

    def parsers(parser):
        yield parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in dict.fromkeys(action.choices.values()):
                    yield from parsers(sub)

    declared = 0
    for parser in parsers(build_parser()):
        dests = {a.dest for a in parser._actions}
        for kind in ("output_files", "output_dirs"):
            names = parser.get_default(kind) or ()
            declared += len(names)
            assert set(names) <= dests, (parser.prog, kind, names)
    assert declared >= 11  # predict's two, calibrate's, validate's, study's, plot's, evaluate's,
    # notebook's and four benchmarks' (collectives checks on its rank 0 itself)


@pytest.mark.parametrize("action", ["up", "down"])
def test_the_sandbox_refuses_a_timeout_that_is_not_positive_before_touching_anything(capsys, tmp_path,
                                                                                     action):
    where = tmp_path / "none"
    assert main(["sandbox", "slurm", action, "--dir", str(where), "--timeout", "0"]) == 2
    assert "--timeout=0.0 is not valid: seconds to wait, > 0" in capsys.readouterr().out
    assert not where.exists()


def test_the_sandbox_refuses_a_directory_that_is_a_file_before_touching_anything(capsys, tmp_path):
    """`up` writes its slurm.conf, keys and logs under --dir: a file there was a traceback from
    deep in the start-up."""
    where = tmp_path / "afile"
    where.write_text("")
    assert main(["sandbox", "slurm", "up", "--dir", str(where)]) == 2
    assert f"--dir='{where}' is not valid: is a file, and a directory is wanted" in \
        capsys.readouterr().out
    assert where.read_text() == ""


@pytest.fixture
def unwritable(tmp_path):
    """A directory no file can be made in: a read-only mount as root (root passes permission
    bits, as it does on a cluster's scratch), a directory without write permission otherwise."""
    where = tmp_path / "ro"
    where.mkdir()
    if os.geteuid() == 0:
        mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro", "tmpfs", str(where)],
                               capture_output=True, text=True)
        if mount.returncode != 0:
            pytest.skip(f"cannot mount a read-only tmpfs here: {mount.stderr.strip()}")
        yield where
        subprocess.run(["umount", str(where)], check=True)
    else:
        where.chmod(0o555)
        yield where
        where.chmod(0o755)


@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.parametrize("flag", ["--output-dir", "--checkpoint-dir", "--summary-json"])
def test_an_unwritable_output_path_is_refused_before_any_training(unwritable, ranks, flag):
    """Found in the pre-flight, not at the first write: exit 2 with one message naming the field,
    and under mpiexec no rank is left waiting for the one that refused."""
    field = flag[2:].replace("-", "_")
    path = unwritable / ("summary.json" if field == "summary_json" else "out")
    args = ["train", "--algorithm", "sync_ps", "--steps", "5", "--threads", "1", flag, str(path)]
    proc = downpour(*args) if ranks == 1 else mpiexec(ranks, str(BIN / "downpour"), *args, timeout=120)
    assert proc.returncode == 2, explain(proc)
    message = f"{field}='{path}' is not valid: cannot be created: {unwritable}: "
    assert proc.stderr.count(message) == 1, explain(proc)
    assert "Read-only file system" in proc.stderr or "Permission denied" in proc.stderr
    assert "samples/s" not in proc.stdout and not (unwritable / "out").exists()


def test_a_bucket_larger_than_the_model_warns_of_no_overlap(capsys):
    """Legal, and pointless unless meant: one bucket, so the allreduce waits for all of backward."""
    assert main(["train", "--algorithm", "allreduce", "--bucket-cap-mb", "1000", "--steps", "3",
                 "--threads", "1"]) == 0
    assert ("bucket_cap_mb=1000 holds the whole model (0.10 MB of parameters) in one bucket: its "
            "allreduce starts only after backward, with no overlap; give one smaller than the "
            "model, e.g. 0.025") in capsys.readouterr().err  # the default 25 holds it too: not said
    assert main(["train", "--algorithm", "allreduce", "--steps", "3", "--threads", "1"]) == 0
    assert "bucket_cap_mb" not in capsys.readouterr().err  # the default: no warning


def test_a_period_longer_than_the_run_warns_that_the_workers_never_meet(capsys):
    """diloco's default period is 20 steps: a short run of it took no outer step, silently."""
    assert main(["train", "--algorithm", "localsgd", "--steps", "3", "--threads", "1"]) == 0
    assert ("downpour train: warning: period=4 is longer than the run's 3 steps: the workers never "
            "meet (nothing is averaged); give a period of at most 3, or more steps") \
        in capsys.readouterr().err
    for meet in (["--period", "3"], ["--sync-steps", "1"]):  # they meet: nothing to say
        assert main(["train", "--algorithm", "localsgd", "--steps", "3", "--threads", "1", *meet]) == 0
        assert "period=" not in capsys.readouterr().err, meet


def test_the_configs_warnings_are_said_as_the_commands(capsys):
    """A setting that does nothing was a raw Python warning (file, line and source line)."""
    assert main(["train", "--optimizer", "adam", "--momentum", "0.9", "--steps", "3",
                 "--threads", "1"]) == 0
    err = capsys.readouterr().err
    assert ("downpour train: warning: momentum=0.9 has no effect with optimizer='adam'; it applies "
            "to 'sgd' only\n") in err and "UserWarning" not in err, err


def test_flags_text_is_parsed_into_each_fields_type(tmp_path):
    args = build_parser().parse_args(
        ["train", "--algorithm", "sync_ps", "--batch-size", "64", "--lr", "0.1", "--steps", "7",
         "--epochs", "none", "--momentum", "0", "--servers", "1", "--server", "colocated"])
    config = config_from_args(args)
    assert (config.data.batch_size, config.optim.lr) == (64, 0.1)
    assert (config.length.steps, config.length.epochs) == (7, None)
    assert (config.optim.momentum, config.options.servers, config.options.server) == (0.0, 1, "colocated")
    # and win over a config file's values
    (tmp_path / "run.json").write_text('{"algorithm": "sync_ps", "steps": 50, "lr": 0.5}')
    config = config_from_args(build_parser().parse_args(
        ["train", "--config", str(tmp_path / "run.json"), "--steps", "3"]))
    assert (config.length.steps, config.optim.lr) == (3, 0.5)
    study = build_parser().parse_args(["study", "--steps", "7", "--batch-size", "16"])
    assert (study.steps, study.batch_size) == (7, 16)


def test_an_emulated_study_runs_as_many_steps_as_notebook_02s_sweep_unless_told():
    from downpour_lib.cli.study import study_base
    from downpour_lib.study.scaling import EMULATED_STEPS, SCALING_BASE

    def steps(*flags: str) -> int:
        return study_base(build_parser().parse_args(["study", *flags]))["steps"]

    assert steps() == SCALING_BASE["steps"] == 8 and EMULATED_STEPS == 12
    assert steps("--compute", "emulated", "--emulated-step-s", "0.05") == EMULATED_STEPS
    assert steps("--compute", "emulated", "--steps", "5") == steps("--steps", "5") == 5
    assert "compute" not in study_base(build_parser().parse_args(["study"]))  # a real run's identity


def test_options_that_share_a_name_share_a_type():
    from dataclasses import fields

    kinds = {}
    for cls in ALGORITHMS.values():
        hints = typing.get_type_hints(cls.Options)
        for f in fields(cls.Options):
            hint = hints[f.name]
            kind = type(typing.get_args(hint)[0]) if typing.get_origin(hint) is Literal else hint
            assert kinds.setdefault(f.name, kind) == kind, (cls.name, f.name)  # unions: equal, not one


def test_no_option_is_named_as_a_field_of_the_run():
    """An algorithm's option named as a TrainConfig field (seed, warmup_steps) would give two flags
    of one name: argparse's 'conflicting option string' on every `downpour train`."""
    import dataclasses

    from downpour_lib.config import FLAGS_ONLY, TrainConfig
    from downpour_lib.options import OPTIONS

    run = set(TrainConfig.flat_fields()) | set(FLAGS_ONLY)
    clashes = {(name, f.name) for name, cls in OPTIONS.items() for f in dataclasses.fields(cls)
               if f.name in run}
    assert not clashes, clashes


def test_a_config_file_with_a_number_in_quotes_exits_2(tmp_path, capsys):
    (tmp_path / "run.json").write_text('{"algorithm": "local", "steps": "10"}')
    assert main(["train", "--config", str(tmp_path / "run.json")]) == 2
    assert ("steps='10' is not valid: must be an integer, not a string: write 10 without quotes"
            in capsys.readouterr().err)


@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.parametrize("flag, expected", [
    (["--device", "cuda"], "device='cuda' is not valid: CUDA is not available on "),
    (["--backend", "nccl"], "backend='nccl' is not valid: nccl needs CUDA devices and CUDA is not "
                            "available on "),
])
def test_no_cuda_for_cuda_or_nccl_exits_2_with_one_message(monkeypatch, ranks, flag, expected):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no CUDA, even on a machine that has some
    args = ["train", "--algorithm", "sync_ps", "--steps", "5", "--threads", "1", *flag]
    proc = downpour(*args) if ranks == 1 else mpiexec(ranks, str(BIN / "downpour"), *args)
    assert proc.returncode == 2, explain(proc)
    output = proc.stdout + proc.stderr
    assert output.count("downpour train: error:") == 1 and output.count(expected) == 1, explain(proc)
    assert "Traceback" not in output, explain(proc)


def test_unknown_flag_is_a_usage_error(capsys):
    assert main(["train", "--learning-rate", "0.1"]) == 2
    assert "unrecognized arguments: --learning-rate" in capsys.readouterr().err


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_misspelled_flag_is_said_once_with_the_flag_meant_and_the_commands_usage(ranks):
    """Under mpiexec every rank printed it, under a usage line listing `{train}` alone of the
    twelve commands, with no suggestion."""
    args = ["train", "--compresion", "fp16"]
    proc = downpour(*args) if ranks == 1 else mpiexec(ranks, str(BIN / "downpour"), *args)
    assert proc.returncode == 2, explain(proc)
    output = proc.stdout + proc.stderr
    assert output.count("downpour train: error: unrecognized arguments: --compresion fp16; did you "
                        "mean --compression?") == 1, explain(proc)
    assert output.count("usage: downpour train [options] (`downpour train --help` lists them)") == 1
    assert "{train}" not in output and "Traceback" not in output, explain(proc)


def test_a_misspelled_flag_of_a_verb_is_said_by_the_verb(capsys):
    """`model predict --wokers 8` was said by `model`, whose flags gave no suggestion."""
    assert main(["model", "predict", "--model", "resnet50", "--wokers", "8"]) == 2
    err = capsys.readouterr().err
    assert err.endswith("downpour model predict: error: unrecognized arguments: --wokers 8; did you "
                        "mean --workers?\n"), err
    assert err.startswith("usage: downpour model predict [options]"), err


def test_a_misspelled_command_names_the_command_meant(capsys):
    assert main(["trian", "--steps", "3"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'trian'" in err and err.rstrip().endswith("did you mean train?"), err
    assert "{train,evaluate,models,datasets,study,plot,model,bench,profiles,notebook,lab,sandbox}" in err


def test_the_list_of_commands_is_every_parsers_line_and_imports_neither_torch_nor_pandas():
    """`downpour --help`, a new user's first command, lists each command with the line its own
    parser gives, and builds none of those parsers (4 s here, for torch and pandas)."""
    import argparse

    full = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    code = ("import json, sys\nfrom downpour_lib.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit as stop:\n    status = stop.code\n"
            "print(json.dumps([status, 'torch' in sys.modules, 'pandas' in sys.modules]))")
    proc = subprocess.run([sys.executable, "-c", code], env={**launch_env(), "COLUMNS": "300"},
                          capture_output=True, text=True, timeout=120, cwd=ROOT)  # no line wraps
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [0, False, False], explain(proc)
    listed = [line.split(None, 1) for line in proc.stdout.splitlines() if line.startswith("    ")]
    assert listed == [[action.dest, action.help] for action in full._choices_actions], explain(proc)
    assert len(listed) == 12


def test_console_script_exit_status_and_listing():
    proc = downpour("train", "--algorithm", "nope")
    assert proc.returncode == 2, explain(proc)
    assert f"choose one of {ALGORITHM_NAMES}" in proc.stderr
    assert "sgp" in ALGORITHM_NAMES and "sync_ps" in ALGORITHM_NAMES


@pytest.mark.parametrize("args", [("models",), ("model", "presets")])
def test_a_reader_that_leaves_early_ends_the_command_quietly(args):
    """`downpour ... | head`: the reader gone, we end as a Unix tool dies of SIGPIPE (128 + 13),
    with nothing on stderr (it was a BrokenPipeError traceback). The read end is closed before the
    command has written anything, so every write of it meets a closed pipe."""
    proc = subprocess.Popen([str(BIN / "downpour"), *args], env=launch_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    _, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 141 and stderr == "", (proc.returncode, stderr)


def test_train_from_a_config_file_with_flag_overrides(tmp_path):
    (tmp_path / "run.yaml").write_text("algorithm: local\nmodel: lenet\ndataset: digits\n"
                                       "steps: 50\nthreads: 1\nlr: 0.5\n")
    out = tmp_path / "summary.json"
    assert main(["train", "--config", str(tmp_path / "run.yaml"), "--lr", "0.05",
                 "--summary-json", str(out)]) == 0
    summary = read_json(out)
    assert summary["lr"] == 0.05 and summary["steps"] == 50 and summary["model"] == "lenet"
    assert summary["config"]["lr"] == 0.05
    for key in ("samples_per_s", "final_train_loss", "test_accuracy", "git_sha", "wall_s"):
        assert key in summary
    assert summary["test_accuracy"] > 0.2  # learned: chance is 0.1


def test_models_and_datasets_listings(capsys):
    assert main(["datasets"]) == 0
    out = capsys.readouterr().out
    assert all(n in out for n in ("digits", "mnist1d", "synthetic-cifar", "imagefolder", "cifar100"))
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    # inception_small, torchvision resnet18, cnn1d, GPT-2 small
    assert "1,649,402" in out and "11,689,512" in out and "5,210" in out and "124,439,808" in out
    assert len(out.strip().splitlines()) == 17  # header + 13 classifiers + 3 language models


def test_model_predict_reads_the_calibration_make_study_wrote(tmp_path, monkeypatch, capsys):
    """`make study` calibrates the model into results/<host>/scaling/; `model predict` right after
    it reads that file (and says which), and names a missing calibration's two places and makers."""
    from downpour_lib.study.core import host_dirname

    monkeypatch.chdir(tmp_path)
    assert main(["model", "predict", "--model", "inception_small"]) == 2
    err = capsys.readouterr().err
    here = f"results/{host_dirname()}"
    assert f"calibration='{here}/scaling/calibration.json' is not valid: no such file, nor " \
           f"{here}/model/calibration.json: run `make study`" in err, err
    written = tmp_path / here / "scaling" / "calibration.json"
    written.parent.mkdir(parents=True)
    written.write_text((ROOT / "results/reference/scaling/calibration.json").read_text())
    assert main(["model", "predict", "--model", "inception_small", "--algorithm", "allreduce,sgp",
                 "--workers", "2,64"]) == 0
    out = capsys.readouterr().out
    assert f"({here}/scaling/calibration.json)" in out and out.count("allreduce") >= 2, out



def test_adpsgd_on_an_odd_world_names_the_ranks_not_a_topology_never_set():
    """It said `topology='bipartite_exponential' is not valid`, a value the user never gave: the
    number of ranks is what to change, and the graph is named as adpsgd's default."""
    proc = mpiexec(3, str(BIN / "downpour"), "train", "--algorithm", "adpsgd", "--model", "mlp",
                   "--steps", "5", "--threads", "1")
    assert proc.returncode == 2, explain(proc)
    output = proc.stdout + proc.stderr
    assert output.count("downpour train: error: world_size=3 is not valid: adpsgd's graph, "
                        "topology='bipartite_exponential' (its default and only one), pairs odd "
                        "(active) with even (passive) ranks") == 1, explain(proc)
    assert "launch 2 or 4 ranks, or use sgp or dpsgd" in output, explain(proc)


def test_a_cluster_error_in_a_notebook_is_one_line_exit_2(tmp_path, capsys):
    """A ClusterError in a cell (several running clusters, engines that did not start) was a
    24-line traceback from `downpour notebook run`; it is its message, as a bad parameter's."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("profile = 'x'")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(
        "from downpour_lib.cluster import ClusterError\n"
        "raise ClusterError(f'profile {profile!r} runs 2 clusters; use_cluster does not start another')")]
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    assert main(["notebook", "run", str(path), "--no-save"]) == 2
    err = capsys.readouterr().err
    assert err == ("downpour notebook: error: nb.ipynb: profile 'x' runs 2 clusters; use_cluster "
                   "does not start another\n"), err


def test_a_published_value_a_hair_outside_its_band_does_not_print_as_inside():
    """`model check` counts a check outside its band when outside_band > 0, and printed it at three
    decimals: 0.000 beside 'inside the band: 0 of 1'."""
    from downpour_lib.cli.model_hardware import _outside

    assert [_outside(v) for v in (0.0, 0.0004, -0.0004, 0.0123)] == ["0.000", "4.0e-04", "-4.0e-04",
                                                                     "0.012"]
