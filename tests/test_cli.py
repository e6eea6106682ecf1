"""The command line: bad input exits 2 naming field, value and fix; good input trains."""

import typing
from typing import Literal

import pytest
from conftest import BIN, downpour, explain, mpiexec, read_json

from downpour_lib.algorithms import ALGORITHMS
from downpour_lib.cli import build_parser, config_from_args, main

ALGORITHM_NAMES = ", ".join(sorted(ALGORITHMS))  # every registered one, as the error lists them


@pytest.mark.parametrize("args, expected", [
    (["--algorithm", "nope"], f"algorithm='nope' is not valid: choose one of {ALGORITHM_NAMES}"),
    (["--batch-size", "0"], "batch_size=0"),
    (["--lr", "-1"], "lr=-1.0"),
    (["--lr", "inf"], "lr=inf is not valid: must be a finite number > 0"),
    (["--lr", "nan"], "lr=nan is not valid: must be a finite number > 0"),
    (["--weight-decay", "inf"], "weight_decay=inf is not valid: must be a finite number >= 0"),
    (["--algorithm", "allreduce", "--bucket-cap-mb", "inf"], "bucket_cap_mb=inf is not valid"),
    (["--steps", "5", "--epochs", "1"], "give steps or epochs, not both"),
    (["--model", "vgg16"], "vgg16 needs images at least 32x32; the data set gives 8x8"),
    (["--algorithm", "sync_ps", "--server", "dedicated"], "dedicated server needs at least 2 ranks"),
    (["--algorithm", "sync_ps", "--bucket-cap-mb", "5"], "has no such option (its options: server, servers)"),
    (["--batch-size", "lots"], "batch_size='lots'"),
    (["--dataset", "mnist", "--data-dir", "/nonexistent/x"], "/nonexistent/x/MNIST/raw"),
])
def test_bad_input_exits_2_with_a_useful_message(capsys, args, expected):
    assert main(["train", *args]) == 2
    assert expected in capsys.readouterr().err


def test_flags_text_is_parsed_into_each_fields_type(tmp_path):
    args = build_parser().parse_args(
        ["train", "--algorithm", "sync_ps", "--batch-size", "64", "--lr", "0.1", "--steps", "7",
         "--epochs", "none", "--momentum", "0", "--servers", "1", "--server", "colocated"])
    config = config_from_args(args)
    assert (config.batch_size, config.lr, config.steps, config.epochs) == (64, 0.1, 7, None)
    assert (config.momentum, config.options.servers, config.options.server) == (0.0, 1, "colocated")
    # and win over a config file's values
    (tmp_path / "run.json").write_text('{"algorithm": "sync_ps", "steps": 50, "lr": 0.5}')
    config = config_from_args(build_parser().parse_args(
        ["train", "--config", str(tmp_path / "run.json"), "--steps", "3"]))
    assert (config.steps, config.lr) == (3, 0.5)
    study = build_parser().parse_args(["study", "--steps", "7", "--batch-size", "16"])
    assert (study.steps, study.batch_size) == (7, 16)


def test_options_that_share_a_name_share_a_type():
    from dataclasses import fields

    kinds = {}
    for cls in ALGORITHMS.values():
        hints = typing.get_type_hints(cls.Options)
        for f in fields(cls.Options):
            hint = hints[f.name]
            kind = type(typing.get_args(hint)[0]) if typing.get_origin(hint) is Literal else hint
            assert kinds.setdefault(f.name, kind) is kind, (cls.name, f.name)


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
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--learning-rate", "0.1"])
    assert exit_.value.code == 2
    assert "unrecognized arguments: --learning-rate" in capsys.readouterr().err


def test_console_script_exit_status_and_listing():
    proc = downpour("train", "--algorithm", "nope")
    assert proc.returncode == 2, explain(proc)
    assert f"choose one of {ALGORITHM_NAMES}" in proc.stderr
    assert "sgp" in ALGORITHM_NAMES and "sync_ps" in ALGORITHM_NAMES


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
    # inception_small, torchvision resnet18, cnn1d
    assert "1,649,402" in out and "11,689,512" in out and "5,210" in out
    assert len(out.strip().splitlines()) == 14  # header + 13 models
