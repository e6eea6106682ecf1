"""The transformer language model and its text: the model is GPT-2's (size, causality, tied head),
the corpus and the user's own text and token files are read as documented and fail with clear
messages, N synchronous ranks equal one process on the N-times batch, and every algorithm lowers
the validation loss on the standard library's text."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import explain, mpi_python, one_session

from downpour_lib import TrainConfig, make_trainer
from downpour_lib.comm.runtime import DistContext
from downpour_lib.data import ShardSampler, load_dataset
from downpour_lib.data.text import TokenSource, stdlib_corpus
from downpour_lib.errors import ConfigError, DataError
from downpour_lib.models import MODELS, build_model, parameter_count
from downpour_lib.perf.terms import gradient_ready_at


def test_gpt2_small_has_gpt2s_parameter_count():
    with torch.device("meta"):
        model = build_model("gpt2", (1024,), 50257)
    # GPT-2 small: 124,439,808 with its 1,024 positions and the head tied to the embedding
    assert parameter_count(model) == 124_439_808
    assert model.head.weight is model.tokens.weight


def test_a_token_never_sees_the_tokens_after_it():
    torch.manual_seed(0)
    model = build_model("gpt-nano", (16,), 256).eval()
    x = torch.randint(256, (2, 16))
    changed = x.clone()
    changed[:, 9:] = (changed[:, 9:] + 1) % 256
    out, out_changed = model(x), model(changed)
    assert out.shape == (2, 16, 256)
    assert torch.allclose(out[:, :9], out_changed[:, :9], atol=1e-6)
    assert not torch.allclose(out[:, 9:], out_changed[:, 9:])


def test_models_and_data_of_different_tasks_are_refused_naming_what_fits():
    with pytest.raises(ConfigError, match="language model.*token data set"):
        build_model("gpt-nano", (1, 8, 8), 10)
    with pytest.raises(ConfigError, match="classifies images.*gpt-nano"):
        build_model("lenet", (128,), 256)
    train = load_dataset("stdlib-text").train
    with pytest.raises(ConfigError, match="classifies images"):
        make_trainer(TrainConfig(model="mlp", dataset="stdlib-text", steps=2, warmup_steps=1),
                     DistContext.single())
    assert MODELS["gpt2"].task == "lm" and train.input_shape == (128,)


def test_windows_are_next_token_pairs_and_workers_read_disjoint_text():
    source = TokenSource(np.arange(1001) % 256, 10, 256)
    assert len(source) == 100
    x, y = source.batch(torch.tensor([0, 7]))
    assert x[1].tolist() == list(range(70, 80)) and y[1].tolist() == list(range(71, 81))
    shards = [set(ShardSampler(len(source), 5, w, 3, 0).shard(0).tolist()) for w in range(3)]
    assert not (shards[0] & shards[1] or shards[1] & shards[2] or shards[0] & shards[2])
    # disjoint windows: no token position is read by two workers
    covered = [set(range(i * 10, i * 10 + 10)) for s in shards for i in s]
    assert sum(map(len, covered)) == len(set().union(*covered))


def test_the_corpus_splits_the_standard_library_by_file_with_a_fixed_seed():
    train, val = stdlib_corpus(max_bytes=200_000, validation=0.1, seed=0)
    again_train, again_val = stdlib_corpus(max_bytes=200_000, validation=0.1, seed=0)
    assert np.array_equal(train, again_train) and np.array_equal(val, again_val)
    assert len(train) >= 200_000 and len(val) >= 20_000
    other_train, _ = stdlib_corpus(max_bytes=200_000, validation=0.1, seed=1)
    assert not np.array_equal(train[:1000], other_train[:1000])
    # whole files: the validation text does not appear in training
    probe = bytes(val[100:164])
    assert probe not in bytes(train)


def test_your_own_text_and_token_files_load_and_bad_ones_say_what_to_do(tmp_path):
    (tmp_path / "input.txt").write_text("to be or not to be, that is the question\n" * 400)
    splits = load_dataset("textfile", tmp_path)
    assert splits.train.num_classes == 256 and len(splits.train) > len(splits.test) > 0
    ids = np.arange(5000, dtype=np.uint16) % 50257
    ids.tofile(tmp_path / "train.bin")
    ids[:3000].tofile(tmp_path / "val.bin")
    tokens = load_dataset("tokens", tmp_path)
    assert tokens.train.input_shape == (1024,) and len(tokens.train) == 4
    with pytest.raises(DataError, match="no .*train.txt.*input.txt.*--data-dir"):
        load_dataset("textfile", tmp_path / "missing")
    (tmp_path / "val.bin").write_bytes(b"\x01\x02\x03")
    with pytest.raises(DataError, match="odd number of bytes"):
        load_dataset("tokens", tmp_path)
    with pytest.raises(DataError, match="token id 300 outside the vocabulary of 256"):
        TokenSource(np.array([1, 2, 300] * 10), 4, 256)


def test_the_performance_model_sees_the_tied_weight_once():
    model = build_model("gpt-nano", (32,), 256)
    ready = gradient_ready_at(model, torch.randint(256, (2, 32)))
    assert len(ready) == 10 and ready[-1] == 1.0
    # the embedding (tied to the head) is 32,768 of gpt-nano's 0.4M parameters: its gradient is
    # the last to be ready, so the last tenth of the bytes waits for the end of backward
    assert ready[-2] < 1.0


def test_a_language_model_run_reports_perplexity_and_tokens_per_second():
    config = TrainConfig(model="gpt-nano", dataset="stdlib-text", steps=6, warmup_steps=1,
                         batch_size=4, threads=1)
    s = make_trainer(config, DistContext.single()).run().summary
    assert s["tokens_per_s"] == pytest.approx(s["samples_per_s"] * 128)
    assert s["test_perplexity"] == pytest.approx(np.exp(s["test_loss"]))
    assert s["test_perplexity"] < 256  # below a uniform guess over the bytes after 6 steps


def test_synchronous_ranks_equal_one_process_on_the_n_times_batch_for_the_lm():
    proc = mpi_python(3, "lm_equivalence.py", timeout=400)
    assert proc.returncode == 0, explain(proc)
    cases = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [c["case"] for c in cases] == ["allreduce, 3 workers", "sync_ps dedicated, 2 workers"]
    for case in cases:
        assert case["ok_all_ranks"] and case["max_abs_diff"] < 1e-5, case
        assert case["max_loss_diff"] < 1e-5 and case["reference_moved"] > 1e-2, case


# On this corpus a uniform guess over bytes scores ln 256 = 5.55 nats, the bytes' own frequencies
# (a model that ignores context) 3.31 and a bigram table 2.36 (Python 3.11's library). Below 3.2,
# an algorithm has learned context. At 100 steps of 8 samples here, on 128 validation windows
# spread over the split (eval_samples; all 625 took a quarter of the test's time and scored each
# 0.02-0.03 lower): allreduce and ddp 2.72, localsgd 2.76, osgp, dpsgd and adpsgd 2.80, sgp 2.83,
# easgd 2.88, slowmo 2.98, diloco 3.05, sync_ps and downpour 3.06. Batches of 16 took 30% longer
# for the same margin (80 steps: 3.02 at most); 80 steps of 8 left only 0.07 (sync_ps and downpour
# 3.13), 40 steps of 16 none (3.3-3.5), and a higher learning rate less (60 steps at 0.006: up
# to 3.37).
LEARNED_CONTEXT_NATS = 3.2
LM_ALGORITHMS = ["sync_ps", "downpour", "allreduce", "ddp", "sgp", "osgp", "dpsgd", "adpsgd",
                 "localsgd", "easgd", "diloco", "slowmo"]


def test_every_algorithm_lowers_the_validation_loss_on_the_corpus(tmp_path):
    # two ranks: a server and a worker, or two workers (adpsgd's bipartite graph needs an even count)
    base = dict(model="gpt-nano", dataset="stdlib-text", steps=100, warmup_steps=2,
                batch_size=8, threads=1, seed=0, optimizer="adam", lr=0.003, eval_samples=128)
    runs = {name: {**base, "algorithm": name} for name in LM_ALGORITHMS}
    found = one_session(2, runs, tmp_path, timeout=1500)
    losses = {name: round(s["test_loss"], 3) for name, s in found.items()}
    above = {name: loss for name, loss in losses.items() if not loss < LEARNED_CONTEXT_NATS}
    assert not above, f"above {LEARNED_CONTEXT_NATS}: {above}; all: {losses}"
