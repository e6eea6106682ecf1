"""The optimizer's update once a step (``terms.OPTIMIZER_BYTES``, a hardware file's ``optimizer``
and ``memory_gbyte_per_s``; a calibration's measured ``update_s``): inside a rate measured at its
accumulation, paid again by a step of fewer passes, a range at both ends of the band."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest
from conftest import ROOT, downpour, explain

from downpour_lib.errors import ConfigError
from downpour_lib.perf import calibrate as calib
from downpour_lib.perf.hardware import hardware_from_dict
from downpour_lib.perf.perfmodel import predict
from downpour_lib.perf.presets import PRESETS, accumulating
from downpour_lib.perf.terms import MEMORY_RATE, OPTIMIZER_BYTES, optimizer_s

#: BERT-large on a node of A100s, measured at 64 passes a step (as dgx-a100-bert's TF32 model)
SPEC = {"devices_per_node": 8, "memory_gbyte_per_s": 2039,
        "links": {"intra": {"gbit_per_s": 2400}, "inter": {"gbit_per_s": 1600, "transport": "rdma"}},
        "models": {"bert": {"batch": 128, "images_per_s": 317, "parameters": 336232258,
                            "accumulation": 64, "multiply_adds": 4.0107e10, "node_compute": "none",
                            "optimizer": "lamb"}}}


def test_lambs_update_is_its_kernels_bytes_over_the_devices_memory():
    """NVIDIA's fused LAMB moves 32 + 5 bytes a parameter a byte of gradient, LAMB op by op 52 +
    5 (the kernels counted in terms.OPTIMIZER_BYTES): BERT-large's fp32 update on an A100 80GB at
    88 % of its 2,039 GB/s takes 9.7 to 13.5 ms, each end's bytes over that rate; at fp16
    gradients 5 bytes fewer a parameter for each 2 the gradient loses."""
    low, high = optimizer_s("lamb", 336232258, 4, 2039)
    assert (low, high) == pytest.approx(((32 + 20) * 336232258 / (2039e9 * MEMORY_RATE),
                                         (52 + 20) * 336232258 / (2039e9 * MEMORY_RATE)))
    assert 0.0095 < low < 0.0100 and 0.0133 < high < 0.0137
    half = optimizer_s("lamb", 336232258, 2, 2039)
    assert high - half[1] == pytest.approx(10 * 336232258 / (2039e9 * MEMORY_RATE))
    # each optimizer's fused kernel moves less than one kernel an operation, Adam more than SGD
    for name in OPTIMIZER_BYTES:
        a, b = optimizer_s(name, 1e9, 4, 1000)
        assert 0 < a < b, name
    assert optimizer_s("sgd", 1e9, 4, 1000)[1] < optimizer_s("adam", 1e9, 4, 1000)[0]


def test_a_step_of_fewer_passes_pays_the_update_its_rate_spread_over_more():
    """At the accumulation its rate was measured at, a model that names its optimizer is
    predicted as one that does not (the update is inside the rate). At 2 passes a step, each end
    of the band takes a step longer by that end's update times (1 - 2/64): the update once, less
    the two 64ths of it the measured passes hold. The band widens by the range's width; at more
    passes than measured a step saves it, and the band's ends stay in order."""
    cal = hardware_from_dict(SPEC)
    plain = hardware_from_dict({**SPEC, "models": {"bert": {
        k: v for k, v in SPEC["models"]["bert"].items() if k != "optimizer"}}})
    assert cal.workloads["bert"].optimizer_s == optimizer_s("lamb", 336232258, 4, 2039)
    assert plain.workloads["bert"].optimizer_s == (0.0, 0.0)
    for workers in (8, 64, 256):
        for ours, theirs in zip(accumulating(cal, "bert", 64, workers),
                                accumulating(plain, "bert", 64, workers), strict=True):
            assert ours.step_s == pytest.approx(theirs.step_s, rel=1e-12)
        for end, ours, theirs in zip((0, 1), accumulating(cal, "bert", 2, workers),
                                     accumulating(plain, "bert", 2, workers), strict=True):
            paid = cal.workloads["bert"].optimizer_s[end] * (1 - 2 / 64)
            assert ours.compute_s == pytest.approx(theirs.compute_s + paid, rel=1e-9)
            assert ours.step_s > theirs.step_s + 0.9 * paid
    more = predict(replace(cal, workloads={"bert": replace(cal.workloads["bert"],
                                                            accumulation=128)}), "allreduce", 64, "bert")
    fewer = predict(replace(cal, workloads={"bert": replace(cal.workloads["bert"],
                                                             accumulation=2)}), "allreduce", 64, "bert")
    for p in (more, fewer):
        assert p.efficiency_low <= p.efficiency <= p.efficiency_high and p.step_s_low <= p.step_s_high


def test_the_presets_bert_names_its_optimizer_and_strong_scaling_pays_it():
    """The BERT presets name LAMB and their devices' memory: at 32 DGX A100 nodes, 1 pass a step
    in mixed precision (the README's row), the step is longer than without the update by about
    its share of a pass, 1.5 to 3 % of the step."""
    cal = PRESETS["dgx-a100-bert"]
    w = cal.workloads["bert-large-128-amp"]
    assert w.measured_accumulation == 32 and w.optimizer_s[0] > 0
    one = replace(w, accumulation=1)
    with_it = predict(replace(cal, workloads={**cal.workloads, w.model: one}), "allreduce", 256,
                      w.model)
    without = predict(replace(cal, workloads={**cal.workloads, w.model: replace(
        one, optimizer_s=(0.0, 0.0))}), "allreduce", 256, w.model)
    assert 0.015 < with_it.step_s / without.step_s - 1 < 0.03
    # one GPU at that pass a step pays the update as often: its efficiency is 1 at both ends
    alone = predict(replace(cal, workloads={**cal.workloads, w.model: one}), "allreduce", 1, w.model)
    assert alone.efficiency_low == pytest.approx(1.0) and alone.efficiency_high == pytest.approx(1.0)
    assert alone.step_s_low < alone.step_s_high  # the update's range, in seconds a step


@pytest.mark.parametrize("change, field, says", [
    ({"memory_gbyte_per_s": None}, "models.bert.optimizer", "memory_gbyte_per_s"),
    ({"models": {"bert": {**SPEC["models"]["bert"], "optimizer": "adagrad"}}},
     "models.bert.optimizer", "adam, lamb, sgd"),
    ({"models": {"bert": {**SPEC["models"]["bert"], "optimizer": ["lamb"]}}},
     "models.bert.optimizer", "adam, lamb, sgd"),
    ({"memory_gbyte_per_s": "fast"}, "memory_gbyte_per_s", "GB/s"),
    ({"memory_gbyte_per_s": 0}, "memory_gbyte_per_s", "GB/s"),
])
def test_a_bad_optimizer_or_memory_names_its_field(change, field, says):
    spec = {k: v for k, v in {**SPEC, **change}.items() if v is not None}
    with pytest.raises(ConfigError) as err:
        hardware_from_dict(spec)
    assert err.value.field == field and says in str(err.value), str(err.value)


def test_a_workloads_bad_update_is_refused():
    """A calibration file's update must be a (low, high) of seconds, low <= high."""
    w = PRESETS["dgx-a100-bert"].workloads["bert-large-128"]
    for bad in ((0.2, 0.1), ("fast", 0.1), (0.1,), (-0.1, 0.1)):
        with pytest.raises(ConfigError) as err:
            replace(w, optimizer_s=bad)
        assert err.value.field == "optimizer_s", bad


def test_an_update_longer_than_the_measured_step_is_refused():
    """A measured step holds the update: memory too slow for that (a bandwidth given in Gbit/s,
    or per node) is refused, naming the field and the two times."""
    with pytest.raises(ConfigError) as err:
        hardware_from_dict({**SPEC, "memory_gbyte_per_s": 0.01})
    assert err.value.field == "memory_gbyte_per_s" and "bert's lamb update" in str(err.value)


def test_predict_says_the_update_is_not_measured():
    """`model predict` lists the update's range among what it did not measure, for the model it
    predicts, and the passes its rate holds it over; a model without an optimizer lists none."""
    proc = downpour("model", "predict", "--preset", "dgx-a100-bert", "--model", "bert-large-128-amp",
                    "--workers", "256", "--accumulation", "1")
    assert proc.returncode == 0, explain(proc)
    low, high = (1000 * t for t in PRESETS["dgx-a100-bert"].workloads["bert-large-128-amp"].optimizer_s)
    assert f"the optimizer's update {low:.3g}-{high:.3g} ms a step (its rate holds it over 32 " \
        "passes)" in proc.stdout, proc.stdout
    proc = downpour("model", "predict", "--preset", "dgx-a100", "--model", "resnet50",
                    "--workers", "64")
    assert proc.returncode == 0 and "not measured:" in proc.stdout, explain(proc)
    assert "optimizer" not in proc.stdout


def test_a_calibration_measured_here_pays_its_measured_update_once_a_step(tmp_path):
    """A calibration of the scaling study takes each model's update (``update_s``: the optimizer's
    step, and the algorithm's packing) from the one-worker runs of one pass a step. At one pass
    nothing changes; at 8 passes the step is 8 of the measured ones less 7 updates, where before
    it paid the update in every pass; it is measured, so `model predict` does not list it."""
    study = ROOT / "results" / "reference" / "scaling"
    runs = pd.read_csv(study / "runs.csv")
    cal = calib.calibrate(study / "collectives.json", runs)
    w = cal.workloads["inception_small"]
    alone = runs[(runs.num_workers == 1) & ~runs.algorithm.isin(["sync_ps", "downpour"])]
    assert w.optimizer_s == pytest.approx((alone.update_s.mean(),) * 2)
    assert 0 < w.optimizer_s[0] < 0.01 * w.compute_s and w.measured_accumulation == 1
    # runs that accumulated record a pass as their step, the update in one pass of k: not taken
    accumulated = calib.calibrate(study / "collectives.json",
                                  runs.assign(**{"options.accumulation_steps": 4}))
    assert accumulated.workloads["inception_small"].optimizer_s == (0.0, 0.0)
    without = replace(cal, workloads={"inception_small": replace(w, optimizer_s=(0.0, 0.0))})
    for workers in (1, 2, 64):
        assert predict(cal, "allreduce", workers, "inception_small").step_s == pytest.approx(
            predict(without, "allreduce", workers, "inception_small").step_s, rel=1e-12)
    eight = {"inception_small": replace(w, accumulation=8)}
    paid_once = predict(replace(cal, workloads=eight), "allreduce", 1, "inception_small")
    every_pass = predict(replace(without, workloads={"inception_small": replace(
        without.workloads["inception_small"], accumulation=8)}), "allreduce", 1, "inception_small")
    assert every_pass.step_s - paid_once.step_s == pytest.approx(7 * w.optimizer_s[0], rel=1e-9)
    # the efficiency is against one device at the same passes, which pays its update as often:
    # one worker keeps all of it, 64 no more (against the measured pass it would pass 1)
    assert paid_once.efficiency == pytest.approx(1.0, rel=1e-12)
    assert predict(replace(cal, workloads=eight), "allreduce", 64, "inception_small").efficiency <= 1
    out = tmp_path / "cal.json"
    proc = downpour("model", "calibrate", "--collectives", str(study / "collectives.json"),
                    "--study", str(study / "runs.csv"), "--out", str(out))
    assert proc.returncode == 0, explain(proc)
    assert f"(its update {w.optimizer_s[0] * 1e3:.1f} ms of it, once a step" in proc.stdout
    loaded = calib.load(out).workloads["inception_small"]  # through the file as measured
    assert (loaded.optimizer_s, loaded.measured_accumulation) == (w.optimizer_s, 1)
    proc = downpour("model", "predict", "--calibration", str(out), "--model", "inception_small",
                    "--workers", "2", "--accumulation", "8")
    assert proc.returncode == 0, explain(proc)
    assert "optimizer's update" not in proc.stdout, proc.stdout
