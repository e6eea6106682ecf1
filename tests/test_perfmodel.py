"""The performance model: its costs against hand-derived references, its calibration against this
machine's measurements (a real ``downpour bench collectives`` under mpiexec and the committed scaling
study), and its predictions against published results."""

from __future__ import annotations

import json
import math
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import BIN, ROOT, downpour, explain, mpiexec

from downpour_lib.errors import ConfigError
from downpour_lib.perf import calibrate as calib
from downpour_lib.perf.calibration import Calibration, Workload
from downpour_lib.perf.netmodel import (
    GBIT,
    Link,
    Network,
    allreduce_s,
    gossip_s,
    pipeline_exposed_s,
    ps_transfer_s,
    ring_allreduce_s,
)
from downpour_lib.perf.perfmodel import modelled_options, predict
from downpour_lib.perf.presets import PARAMETERS, PRESETS, accumulating, published_checks
from downpour_lib.traffic import ring_share

REFERENCE = ROOT / "results" / "reference" / "scaling" / "runs.csv"
LINK = Link(1e-5, 1e9)


def toy(per_node: int = 1, overlap: float = 1.0, compute_s: float = 0.1) -> Calibration:
    w = Workload("m", 32, compute_s, 100e6)
    return Calibration("toy", Network(Link(1e-6, 100e9), LINK, per_node), {"m": w},
                       bucket_bytes=25e6, overlap=overlap)


def test_ring_allreduce_moves_the_bytes_the_meter_counts_at_the_links_rate():
    for n in (2, 3, 8, 64):
        t = ring_allreduce_s(n, 1e8, Link(0.0, 1e9))
        assert t == pytest.approx(float(ring_share("allreduce", n)) * 1e8 / 1e9)
        assert ring_allreduce_s(n, 0, LINK) == pytest.approx(2 * (n - 1) * LINK.alpha_s)
    assert ring_allreduce_s(1, 1e8, LINK) == 0


def test_a_ring_across_nodes_runs_at_the_cards_rate_and_hierarchical_sends_less_latency():
    net = Network(Link(1e-6, 100e9), Link(1e-5, 10e9), per_node=8)
    inside = allreduce_s(8, 1e8, net)
    across = allreduce_s(16, 1e8, net)
    assert inside == pytest.approx(ring_allreduce_s(8, 1e8, net.intra))
    # a ring ordered by node: the card's bandwidth, not divided among the node's ranks (each card
    # carries one ring edge in and one out), and its hops' mean latency: 2 of 16 cross a card
    hop = (2 * 1e-5 + 14 * 1e-6) / 16
    assert across == pytest.approx(ring_allreduce_s(16, 1e8, Link(hop, 10e9)))
    horovod = Network(Link(5e-6, 12e9), Link(1e-5, 3e9), per_node=4)  # 128 nodes x 4, one card
    assert allreduce_s(512, 64e6, horovod) == pytest.approx(
        2 * 511 * (128 * 1e-5 + 384 * 5e-6) / 512 + float(ring_share("allreduce", 512)) * 64e6 / 3e9)
    # 128 ranks on 16 nodes: the two-level scheme pays 2*15 card latencies, not 2*127
    flat, two_level = allreduce_s(128, 1e5, net), allreduce_s(128, 1e5, net, "hierarchical")
    assert two_level < flat
    tree = allreduce_s(1024, 1e3, net, "tree")
    assert tree == pytest.approx(2 * 10 * 1e-5 + 2 * 1e3 / 10e9)
    with pytest.raises(ConfigError, match="collective"):
        allreduce_s(4, 1.0, net, "butterfly")


def test_the_parameter_server_card_is_the_bottleneck_once_workers_outnumber_shards():
    net = Network(LINK, LINK, per_node=1)
    assert ps_transfer_s(1, 1e8, 1, net) == pytest.approx(LINK.transfer_s(1e8))
    assert ps_transfer_s(16, 1e8, 1, net) == pytest.approx(16 * LINK.alpha_s + 16 * 1e8 / 1e9)
    assert ps_transfer_s(16, 1e8, 16, net) == pytest.approx(16 * LINK.alpha_s + 1e8 / 1e9)
    assert gossip_s(1e8, 2, LINK) == pytest.approx(2 * LINK.transfer_s(1e8))


def test_bucket_pipeline_hides_what_backward_outlasts_and_never_the_last_bucket():
    assert pipeline_exposed_s(0.1, 1, 1.0) == pytest.approx(0.1)  # one bucket: nothing to overlap
    assert pipeline_exposed_s(0.1, 4, 1.0) == pytest.approx(0.025)  # long backward: the last one
    # communication-bound: 4 buckets of 1 s, ready every 0.25 s -> done at 0.25 + 4
    assert pipeline_exposed_s(4.0, 4, 1.0) == pytest.approx(0.25 + 4 - 1)


def test_gossip_fanout_is_read_from_the_options_the_algorithms_take():
    """A run's summary says --peers-per-step and --topology the way SGP and D-PSGD take them
    (options.peers_per_step, options.topology); the model sends to as many peers."""
    cal, one = toy(overlap=0.0), LINK.transfer_s(100e6)
    row = {"options.topology": "exponential", "options.peers_per_step": 2.0, "options.lr": 0.1}
    assert modelled_options(row) == {"topology": "exponential", "peers_per_step": 2}
    assert predict(cal, "sgp", 8, "m", modelled_options(row)).comm_s == pytest.approx(2 * one)
    assert predict(cal, "sgp", 8, "m", {"topology": "ring"}).comm_s == pytest.approx(2 * one)
    assert predict(cal, "sgp", 8, "m", {"topology": "complete"}).comm_s == pytest.approx(7 * one)
    assert predict(cal, "dpsgd", 2, "m").comm_s == pytest.approx(one)  # a ring of two: one peer
    # four ranks' exponential graph has two hops (1, 2): a sweep asking for more gets both
    assert predict(cal, "sgp", 4, "m", {"peers_per_step": 9}).comm_s == pytest.approx(2 * one)
    with pytest.raises(ConfigError, match="topology='torus' is not valid: choose one of") as bad:
        predict(cal, "sgp", 8, "m", {"topology": "torus"})
    assert all(name in str(bad.value) for name in ("complete", "exponential", "ring"))


def test_predictions_reduce_to_their_references():
    cal = toy(overlap=0.0)
    one = predict(cal, "allreduce", 1, "m")
    assert one.step_s == cal.workloads["m"].compute_s and one.efficiency == 1
    ar = predict(cal, "allreduce", 8, "m")
    buckets = 4  # 100 MB in 25 MB buckets, no overlap: four allreduces back to back
    assert ar.comm_s == pytest.approx(buckets * ring_allreduce_s(8, 25e6, LINK))
    local = predict(cal, "localsgd", 8, "m", {"period": 1})
    assert local.comm_s == pytest.approx(ring_allreduce_s(8, 100e6, LINK))
    assert predict(cal, "diloco", 8, "m").comm_s == pytest.approx(local.comm_s / 20)
    assert predict(cal, "sgp", 8, "m").comm_s == pytest.approx(LINK.transfer_s(100e6))
    assert predict(cal, "dpsgd", 8, "m").comm_s == pytest.approx(2 * LINK.transfer_s(100e6))
    # OSGP hides its gossip behind the next step's compute: exposed only what outlasts it
    assert predict(cal, "osgp", 8, "m").comm_s == pytest.approx(LINK.transfer_s(100e6) - 0.1)
    assert predict(toy(compute_s=1.0), "osgp", 8, "m").comm_s == 0
    # ... behind the slowest worker's, whom every step waits for: where the link sets the pace
    # (0.1 s a message, 0.04 s a step), a worker twice as slow hides 0.04 s more of it, and the
    # step does not grow
    short = toy(overlap=0.0, compute_s=0.04)
    plain, slow = (predict(short, "osgp", 8, "m", o) for o in ({}, {"slow_workers": 1,
                                                                    "slowdown": 2}))
    assert slow.comm_s == pytest.approx(plain.comm_s - 0.04)
    assert slow.step_s == pytest.approx(plain.step_s) == pytest.approx(LINK.transfer_s(100e6))
    ps = predict(cal, "sync_ps", 16, "m")
    assert ps.comm_s == pytest.approx(2 * (16 * 1e-5 + 16 * 100e6 / 1e9))
    ideal = predict(toy(overlap=1.0), "allreduce", 8, "m")
    assert ideal.comm_s < ar.comm_s
    for n in (2, 16, 256):
        p = predict(cal, "allreduce", n, "m")
        assert p.samples_per_s == pytest.approx(n * 32 / p.step_s)
        assert p.efficiency == pytest.approx(cal.workloads["m"].compute_s / p.step_s)


def test_bad_input_names_the_field():
    cal = toy()
    with pytest.raises(ConfigError, match="algorithm"):
        predict(cal, "hogwild", 4, "m")
    with pytest.raises(ConfigError, match="workers"):
        predict(cal, "allreduce", 0, "m")
    with pytest.raises(ConfigError, match="model.*has m"):
        predict(cal, "allreduce", 4, "resnet50")
    with pytest.raises(ConfigError, match="bandwidth_Bps"):
        Link(1e-6, 0)
    with pytest.raises(ConfigError, match="overlap"):
        replace(cal, overlap=2.0)


def test_fit_link_recovers_alpha_and_beta_from_rows_the_model_generates():
    truth = Link(20e-6, 5e9)
    rows = [{"backend": "mpi", "op": op, "bytes": m, "world_size": n,
             "p50_s": (ring_allreduce_s(n, m, truth) if op == "allreduce"
                       else math.ceil(math.log2(n)) * truth.alpha_s + m / truth.bandwidth_Bps)}
            for op in ("allreduce", "broadcast") for n in (2, 4) for m in (4096, 1 << 20, 1 << 26)]
    fitted = calib.fit_link(rows + [{"backend": "gloo", "op": "allreduce", "bytes": 1,
                                     "world_size": 2, "p50_s": 1.0}], "mpi")
    assert fitted.alpha_s == pytest.approx(truth.alpha_s, rel=1e-6)
    assert fitted.bandwidth_Bps == pytest.approx(truth.bandwidth_Bps, rel=1e-6)
    with pytest.raises(ConfigError, match="backend.*nccl"):
        calib.fit_link(rows, "nccl")


@pytest.fixture(scope="module")
def collectives(tmp_path_factory) -> Path:
    """A real measurement of this machine's links: two MPI ranks, both backends, as notebook 06
    and ``model_for_study`` take it (``calibrate.measure_collectives``)."""
    return calib.measure_collectives(tmp_path_factory.mktemp("bench") / "c.json", ranks=2)


def test_calibrated_on_the_studys_machine_it_predicts_the_measured_study_within_15_percent():
    """The link measured on the machine that ran the study (its committed collectives, beside its
    runs.csv) and the study's one-worker compute predict every (algorithm, workers) within 15%."""
    cal = calib.calibrate(REFERENCE.parent / "collectives.json", REFERENCE)
    assert cal.network.intra.bandwidth_Bps > 1e8  # shared memory: well over a gigabit
    assert 0 <= cal.overlap <= 1
    w = cal.workloads["inception_small"]
    assert w.param_bytes == pytest.approx(1_649_402 * 4, rel=0.01)  # the model's parameters
    table = calib.compare_with_study(cal, REFERENCE)
    assert set(table["algorithm"]) == set(pd.read_csv(REFERENCE)["algorithm"])
    assert set(table["workers"]) == {1, 2}
    worst = table.loc[table["error"].abs().idxmax()]
    assert abs(worst["error"]) < 0.15, table.to_string()


def test_a_link_measured_here_changes_only_what_crosses_it(collectives):
    """Calibrated on a link measured now, on a machine that may be busy (CI runs three test workers
    on two cores; a link fitted there once put sync_ps's traffic at 14 times its time on the
    study's link, and sync_ps at one worker 15% over its measured step): the fit is a latency and
    a bandwidth, the compute is the study's, so one worker of allreduce (nothing to send) is
    predicted as on the study's own link, and every algorithm that sends is predicted no faster
    than that."""
    here = calib.calibrate(collectives, REFERENCE)
    study = calib.calibrate(REFERENCE.parent / "collectives.json", REFERENCE)
    link = here.network.intra
    assert link.alpha_s >= 0 and 0 < link.bandwidth_Bps < math.inf
    mine = calib.compare_with_study(here, REFERENCE).set_index(["algorithm", "workers"])
    theirs = calib.compare_with_study(study, REFERENCE).set_index(["algorithm", "workers"])
    assert mine.index.equals(theirs.index)
    alone = mine.predicted_step_s[("allreduce", 1)]
    assert alone == pytest.approx(theirs.predicted_step_s[("allreduce", 1)], rel=1e-9)
    assert (mine.predicted_step_s >= alone * (1 - 1e-9)).all(), mine.to_string()
    assert np.isfinite(mine.error).all()


def test_model_cli_calibrates_and_predicts_as_the_readme_says(collectives, tmp_path):
    out = tmp_path / "cal.json"
    proc = downpour("model", "calibrate", "--collectives", str(collectives), "--study",
                    str(REFERENCE), "--out", str(out))
    assert proc.returncode == 0, explain(proc)
    assert "inception_small" in proc.stdout and out.is_file()
    rows_at = tmp_path / "p.json"
    proc = downpour("model", "predict", "--calibration", str(out), "--model", "inception_small",
                    "--algorithm", "allreduce,sync_ps,sgp,localsgd", "--workers", "1,2,1024",
                    "--json", str(rows_at))
    assert proc.returncode == 0, explain(proc)
    rows = json.loads(rows_at.read_text())
    assert len(rows) == 12 and {r["calibration"] for r in rows} == {calib.load(out).name}
    proc = downpour("model", "predict", "--preset", "horovod-pascal-25g", "--model", "resnet101",
                    "--algorithm", "allreduce", "--workers", "8,64,512", "--json", str(rows_at))
    assert proc.returncode == 0, explain(proc)
    rows = json.loads(rows_at.read_text())
    assert [r["workers"] for r in rows] == [8, 64, 512]
    for r in rows:
        assert {"algorithm", "workers", "step_s", "samples_per_s", "efficiency"} <= set(r)
        assert 0 < r["efficiency"] <= 1
    # what was not measured, in units a user can check: TCP with 4 ranks on a 25 Gbit/s card
    # moves 13.6 (nccl-tests#83) to 0.716 x 25 (nccl#209) Gbit/s, as nccl-tests' bus bandwidth
    proc = downpour("model", "predict", "--preset", "horovod-pascal-25g", "--model", "vgg16",
                    "--workers", "128", "--inter-gbit", "25", "--inter-transport", "tcp")
    assert proc.returncode == 0, explain(proc)
    assert "a node's cross-node rate 13.6-17.9 Gbit/s," in proc.stdout, proc.stdout
    proc = downpour("model", "predict", "--preset", "horovod-pascal-25g", "--model", "gpt5")
    assert proc.returncode == 2 and "model" in proc.stderr and "resnet101" in proc.stderr
    # an algorithm's options: 16 shards relieve Downpour's one server card
    per_server = {}
    for servers in ("1", "16"):
        proc = downpour("model", "predict", "--preset", "sgp-v100-10g", "--model", "resnet50",
                        "--algorithm", "downpour", "--workers", "64", "--option",
                        f"downpour.servers={servers}", "--json", str(rows_at))
        assert proc.returncode == 0, explain(proc)
        (row,) = json.loads(rows_at.read_text())
        per_server[servers] = row["samples_per_s"]
        assert row["options.servers"] == int(servers)
    assert per_server["16"] > 4 * per_server["1"]
    proc = downpour("model", "predict", "--preset", "sgp-v100-10g", "--model", "resnet50",
                    "--algorithm", "downpour", "--option", "downpour.lr=2")
    assert proc.returncode == 2 and "option='downpour.lr=2'" in proc.stderr, explain(proc)
    proc = downpour("model", "calibrate", "--collectives", str(tmp_path / "none.json"))
    assert proc.returncode == 2 and "collectives" in proc.stderr and "bench collectives" in proc.stderr


def test_published_results_agree_within_the_stated_tolerances():
    """Overlap is not published for these systems: each prediction is a band, and each of
    Horovod's published values lies inside it: 90, 90 and 68 % at 512 GPUs on RDMA, and 90, 90 and
    79 % at 128 (the chart the README showed before); at 128 GPUs over plain TCP on the same 25
    Gbit/s cards 88 % for ResNet-101 and Inception V3 (within 2 points of the point), and VGG-16
    about 30 % faster on RDMA than on TCP. The paper's 3-4 % that RDMA gave the other two is the
    model's too, to a point. VGG-16 keeps more than the band's middle at both sizes: its
    published values lie where the overlap is near ideal (the band's top at 128)."""
    from downpour_lib.perf.presets import HOROVOD_TCP

    checks = published_checks()
    horovod = [c for c in checks if c.claim.startswith("Horovod")]
    assert len(horovod) == 9 and all(c.low <= c.predicted <= c.high for c in horovod), horovod
    assert all(c.outside_band == 0 for c in horovod), horovod
    vgg = [c for c in horovod if c.claim.startswith("Horovod VGG-16 scaling")]
    assert len(vgg) == 2 and all(c.predicted < c.published for c in vgg), vgg
    assert all(abs(c.error) < 0.02 for c in horovod if "TCP" in c.claim and c.unit == "efficiency")
    for model in ("resnet101", "inception_v3"):
        rdma, tcp = (predict(cal, "allreduce", 128, model) for cal in (PRESETS["horovod-pascal-25g"],
                                                                       HOROVOD_TCP))
        assert 1.02 <= tcp.step_s / rdma.step_s <= 1.05, (model, tcp.step_s / rdma.step_s)
    sgp = next(c for c in checks if c.claim.startswith("SGP"))
    assert 1.5 <= sgp.low <= sgp.high <= 4.5, sgp


def test_the_dgx1_fits_give_their_tables_back_and_checks_err_on_both_sides():
    """The node-compute term is fitted once per input pipeline, each on NVIDIA's DGX-1 16GB tables
    run with it (FP32 and AMP at 1 and 8 V100): the PyTorch DataLoader's of pytorch-21.03 and of
    pytorch-20.12 (the same benchmark, batches and loader: its two ends), DALI on the CPU's of
    pytorch-20.06 (a point). At each end of its term, the others' ranges at their middle, the
    model gives its table's efficiency at 8 GPUs back within half a point (the fit takes off what
    the model adds: the allreduce left exposed, the wait for the slowest, the framework's work);
    each table lies inside the band, and the point between the two (within that half point: at
    the middle of the devices' spread, DALI's table leaves its node term nothing, and the fit
    stops at none). On the published results it
    was not fitted on, its errors fall on both sides of zero."""
    from dataclasses import replace

    from downpour_lib.perf.terms import DGX1_2012_TABLE, DGX1_DALI_TABLE, DGX1_TABLE

    fitted = [c for c in published_checks(include_fitted=True)
              if c.fitted and "DeepLearningExamples" in c.source]
    assert len(fitted) == 6 and sum("DALI" in c.claim for c in fitted) == 2
    assert sum("pytorch-20.12" in c.claim for c in fitted) == 2
    for c in fitted:
        assert c.low < c.published < c.high, c
    for pipeline, tables in (("dgx1-v100", (DGX1_TABLE, DGX1_2012_TABLE)),
                             ("dgx1-v100-dali", (DGX1_DALI_TABLE,))):
        cal = PRESETS[pipeline]
        for end, table in enumerate(tables):
            at_end = replace(cal, node_compute=cal.node_compute.end(end))
            for precision, model in (("fp32", "resnet50"), ("amp", "resnet50-amp")):
                one, eight = (r.images_per_s for r in table if r.precision == precision)
                p = predict(at_end, "allreduce", 8, model)
                assert abs(p.efficiency - eight / 8 / one) <= 0.005, (pipeline, end, precision, p)
        for model in ("resnet50", "resnet50-amp"):
            mine = sorted(c.published for c in fitted if ("DALI" in c.claim) == pipeline.endswith(
                "dali") and ("mixed" in c.claim) == model.endswith("amp"))
            point = predict(cal, "allreduce", 8, model).efficiency
            assert mine[0] - 0.005 <= point <= mine[-1] + 0.005, (pipeline, model, mine, point)
    checks = [c for c in published_checks() if c.unit == "efficiency"]
    assert not any(c.fitted for c in checks)
    errors = [c.error for c in checks]
    assert min(errors) < 0 < max(errors), errors
    # the term itself: under the DataLoader mixed precision loses a share of its step many
    # times full precision's; DALI's two precisions lose alike (what is left beside the
    # framework's work, test_mixed_precision_pays_the_framework_work_of_its_full_precision), and
    # its mixed precision a tenth of the DataLoader's
    node, dali = PRESETS["dgx1-v100"].node_compute, PRESETS["dgx1-v100-dali"].node_compute
    assert node.efficiency(1, "amp") == 1
    assert node.efficiency(8, "amp") < node.efficiency(4, "amp") < node.efficiency(8, "fp32") < 1
    assert node.amp > 10 * node.fp32 and abs(dali.amp - dali.fp32) < 0.001
    assert 1 - dali.efficiency(8, "amp") < (1 - node.efficiency(8, "amp")) / 10


def test_the_overlap_jitter_and_framework_ranges_are_what_pytorchs_ddp_benchmark_allows():
    """Issue 65, item 3: three of the band's ranges are taken from PyTorch's own DDP benchmark
    (terms.DDP_BENCH: 1 GPU without DDP, 8 GPUs of one DGX-1, 16 of two), each recomputed here.
    Overlap: the lowest share at which the model adds no more going from 8 GPUs to 16 (the
    allreduce across the machines) than the table does. Jitter: the largest spread its 1-GPU
    percentiles allow. The framework's work: the narrowest range that puts every row inside its
    band. Those rows are then fitted rows, inside their bands, and not checks."""
    from downpour_lib.perf.perfmodel import _predict, unknown_ends
    from downpour_lib.perf.presets import DDP_BENCH_PRESET
    from downpour_lib.perf.terms import (
        DDP_BENCH,
        DDP_BENCH_PRECISION_S,
        FRAMEWORK_RANGE,
        JITTER_RANGE,
        OVERLAP_RANGE,
    )

    cal = PRESETS[DDP_BENCH_PRESET]
    assert cal.overlap is None and cal.framework is None and cal.jitter_high is not None
    best, worst = unknown_ends(cal)

    def added(model: str, share: float) -> float:  # 8 GPUs -> 16 at the favourable rate
        c = replace(best, overlap=share)
        return (_predict(c, "allreduce", 16, model).step_s
                - _predict(c, "allreduce", 8, model).step_s)

    floors = {}
    for model, row in DDP_BENCH.items():
        most = row[16] - row[8] + DDP_BENCH_PRECISION_S
        assert added(model, 0.0) > most + 1e-3  # no overlap would add more than the table shows
        lo, hi = 0.0, 1.0
        for _ in range(30):
            lo, hi = (lo, (lo + hi) / 2) if added(model, (lo + hi) / 2) <= most else ((lo + hi) / 2, hi)
        floors[model] = hi
    # the range starts at the lowest floor, rounded down; the others need much more
    assert min(floors.values()) - 0.01 <= OVERLAP_RANGE[0] <= min(floors.values()) < 0.7
    assert sorted(floors.values())[1] > 0.8 and OVERLAP_RANGE[1] == 1.0

    spreads = [(p95 - p50 + DDP_BENCH_PRECISION_S) / 1.645 / p50
               for p50, p95 in (row["alone"] for row in DDP_BENCH.values())]
    assert JITTER_RANGE == (0.0, max(spreads)) and 0.004 < JITTER_RANGE[1] < 0.007

    need = {0: [], 1: []}  # samples' compute each row leaves to the framework, at either end
    for model, row in DDP_BENCH.items():
        for n in (8, 16):
            for end, c in enumerate((best, worst)):
                step = _predict(replace(c, framework=0.0), "allreduce", n, model).step_s
                need[end].append((row[n] - step) / (row["alone"][0] / 32))
    # each end rounded outward, to the nearest 0.05 at most
    assert min(need[0]) - 0.05 <= FRAMEWORK_RANGE[0] <= min(need[0])
    assert max(need[1]) <= FRAMEWORK_RANGE[1] <= max(need[1]) + 0.05
    rows = [c for c in published_checks(include_fitted=True) if "DDP benchmark" in c.claim]
    assert len(rows) == 8 and all(c.fitted and c.outside_band == 0 for c in rows), rows
    assert not any("DDP benchmark" in c.claim for c in published_checks())


def test_the_framework_costs_each_round_of_communication_once():
    """The framework's work (samples of compute) is added once per round of communication: to
    every step of an algorithm that talks each step, once a period to periodic averaging, never to
    one worker; measured, it is a point, else a range."""
    base = replace(toy(per_node=8), framework=0.0)
    one_sample = base.workloads["m"].compute_s / base.workloads["m"].batch_size
    worked = replace(base, framework=2.5)
    for algorithm, n, added in (("allreduce", 1, 0.0), ("allreduce", 8, 2.5 * one_sample),
                                ("sgp", 8, 2.5 * one_sample), ("sync_ps", 8, 2.5 * one_sample),
                                ("localsgd", 8, 2.5 * one_sample / 4)):
        options = {"period": 4} if algorithm == "localsgd" else None
        assert predict(worked, algorithm, n, "m", options).step_s == pytest.approx(
            predict(base, algorithm, n, "m", options).step_s + added), algorithm
    ranged = predict(replace(base, framework=None), "allreduce", 8, "m")
    from downpour_lib.perf.terms import FRAMEWORK_RANGE

    assert ranged.step_s_high - ranged.step_s_low == pytest.approx(
        (FRAMEWORK_RANGE[1] - FRAMEWORK_RANGE[0]) * one_sample)
    for bad in (-1.0, float("nan"), True, "2"):
        with pytest.raises(ConfigError, match="framework"):
            replace(base, framework=bad)


def test_mixed_precision_pays_the_framework_work_of_its_full_precision():
    """Tensor cores speed up a step's math, not the framework's work: a mixed-precision model
    (``full_precision:`` in its hardware file) pays that work in its full-precision twin's
    samples. The fitted table shows it (terms.DGX1_DALI_TABLE: DALI's FP32 steps of 128 samples
    and its AMP steps of 256, 2.3x as fast a sample, lose the same milliseconds at 8 GPUs, within
    a tenth), and so does the model: the same seconds a round, in each precision."""
    from downpour_lib.perf.hardware import HARDWARE_DIR, hardware_from_dict, read_hardware
    from downpour_lib.perf.perfmodel import unknown_ends
    from downpour_lib.perf.terms import DGX1_DALI_TABLE

    cal = PRESETS["dgx1-v100-dali"]
    rate = {(r.precision, r.gpus): r.images_per_s for r in DGX1_DALI_TABLE}
    lost = {}
    for precision, model in (("fp32", "resnet50"), ("amp", "resnet50-amp")):
        batch = cal.workloads[model].batch_size
        lost[precision] = batch / (rate[precision, 8] / 8) - batch / rate[precision, 1]
    assert rate["amp", 1] > 2 * rate["fp32", 1]
    assert abs(lost["amp"] / lost["fp32"] - 1) < 0.1, lost
    fp32, amp = cal.workloads["resnet50"], cal.workloads["resnet50-amp"]
    assert fp32.framework_sample_s is None
    assert amp.framework_sample_s == pytest.approx(fp32.compute_s / fp32.batch_size)
    for end in unknown_ends(cal):  # each end of what the preset does not measure
        own = {}
        for model in ("resnet50", "resnet50-amp"):
            steps = [predict(replace(end, framework=f), "allreduce", 8, model).step_s
                     for f in (0.0, 2.5)]
            own[model] = steps[1] - steps[0]
        assert own["resnet50-amp"] == pytest.approx(own["resnet50"]) == pytest.approx(
            2.5 * fp32.compute_s / fp32.batch_size)
    # a full_precision that names no full-precision model of the file: one line naming it
    spec = read_hardware(HARDWARE_DIR / "dgx1-v100-dali.yaml")
    models = spec["models"]
    for bad in ("resnet50-amp", "resnet5", "resnext101-32x4d-amp", ["resnet50"]):
        with pytest.raises(ConfigError, match=r"models.resnet50-amp.full_precision=.*: another.*resnet50"):
            hardware_from_dict(dict(spec, models={**models, "resnet50-amp": {
                **models["resnet50-amp"], "full_precision": bad}}))


def test_parameter_server_throughput_stops_growing_as_workers_outnumber_one_server():
    """ps_pytorch's finding: one server's card caps the job, so adding workers past it buys nothing."""
    cal = PRESETS["sgp-v100-10g"]
    speedup = {n: predict(cal, "sync_ps", n, "resnet50").samples_per_s
               / predict(cal, "sync_ps", 1, "resnet50").samples_per_s for n in (1, 4, 16, 64)}
    assert speedup[16] < 2 * speedup[4] and speedup[64] < 1.2 * speedup[16]
    sharded = predict(cal, "sync_ps", 64, "resnet50", {"servers": 16}).samples_per_s
    assert sharded > 4 * predict(cal, "sync_ps", 64, "resnet50").samples_per_s


def _dle_se_bottleneck():
    """DeepLearningExamples' SE-ResNeXt101-32x4d block (ConvNets image_classification/models,
    commit 7bdfc81d2587): squeeze and excitation through 16 channels (1x1 convolutions with bias)
    on the block's output, added to the shortcut as out * weights (addcmul)."""
    import torch
    import torchvision.models as tvm

    class SEBottleneck(tvm.resnet.Bottleneck):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            c = self.conv3.out_channels
            self.squeeze = torch.nn.Sequential(
                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Conv2d(c, 16, 1), torch.nn.ReLU(inplace=True),
                torch.nn.Conv2d(16, c, 1), torch.nn.Sigmoid())

        def forward(self, x):
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            residual = x if self.downsample is None else self.downsample(x)
            return self.relu(torch.addcmul(residual, out, self.squeeze(out)))

    return SEBottleneck


def test_preset_parameter_counts_are_the_published_models():
    import torchvision.models as tvm

    from downpour_lib.models import parameter_count

    assert parameter_count(tvm.resnet101()) == PARAMETERS["resnet101"]
    assert parameter_count(tvm.vgg16()) == PARAMETERS["vgg16"]
    assert parameter_count(tvm.inception_v3(aux_logits=False, init_weights=False)) == \
        PARAMETERS["inception_v3"]
    import torch

    from downpour_lib.perf.terms import gradient_ready_at

    resnext = tvm.resnet.ResNet(tvm.resnet.Bottleneck, [3, 4, 23, 3], groups=32, width_per_group=4)
    se = tvm.resnet.ResNet(_dle_se_bottleneck(), [3, 4, 23, 3], groups=32, width_per_group=4)
    assert parameter_count(resnext) == PARAMETERS["resnext101-32x4d"]
    assert parameter_count(se) == PARAMETERS["se-resnext101-32x4d"]
    ready = {name: gradient_ready_at(net, torch.zeros(1, 3, 224, 224))
             for name, net in (("resnext101-32x4d", resnext), ("se-resnext101-32x4d", se))}
    for presets, models in ((("dgx1-v100-dali", "dgx1-v100-32g-dali", "dgx-a100-40g-dali"),
                             ("resnext101-32x4d",)),
                            (("dgx1-v100", "dgx1-v100-32g", "dgx-a100"),
                             ("resnext101-32x4d", "se-resnext101-32x4d"))):
        for name in presets:
            for model in models:
                for twin in (model, model + "-amp"):
                    w = PRESETS[name].workloads[twin]
                    assert w.param_bytes == 4 * PARAMETERS[model], (name, twin)
                    assert w.ready_at == pytest.approx(ready[model]), (name, twin)
    # BERT-large as NVIDIA's pre-training builds it: 24 layers of 1024 (16 heads, 4096 wide),
    # embeddings of a vocabulary padded to 30528, the pooler, the masked-LM head (its decoder
    # tied to the embeddings: a bias of its own) and next-sentence head
    nn, hidden = torch.nn, 1024
    bert = nn.ModuleList([nn.Embedding(30528, hidden), nn.Embedding(512, hidden), nn.Embedding(2, hidden),
                          nn.LayerNorm(hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, hidden),
                          nn.LayerNorm(hidden), nn.Linear(hidden, 2)]
                         + [nn.TransformerEncoderLayer(hidden, 16, 4 * hidden) for _ in range(24)])
    assert parameter_count(bert) + 30528 == PARAMETERS["bert-large"]
    for model, w in {**PRESETS["dgx-a100-bert"].workloads,
                     **PRESETS["dgx1-v100-32g-bert"].workloads}.items():
        assert w.param_bytes == (2 if model.endswith("-amp") else 4) * PARAMETERS["bert-large"]
    # TensorFlow's BERT keeps Google's vocabulary of 30522 words: 6 rows and 6 biases fewer
    assert PARAMETERS["bert-large"] - PARAMETERS["bert-large-tf"] == 6 * hidden + 6
    for model, w in PRESETS["dgx-a100-bert-tf"].workloads.items():
        assert w.param_bytes == (2 if model.endswith("-amp") else 4) * PARAMETERS["bert-large-tf"]
    # PaddlePaddle's too; its mixed precision keeps fp32 parameters, so fp32 gradients
    for model, w in PRESETS["dgx-a100-bert-paddle"].workloads.items():
        assert w.param_bytes == 4 * PARAMETERS["bert-large-tf"], model
    # Transformer-XL large as NVIDIA's example builds it (MemTransformerLM, wt103_large.yaml): 18
    # layers of 1024 (relative attention: qkv, output and position projections, no biases), an
    # adaptive input of four clusters (widths 1024 to 16, each projected to 1024) tied to the
    # adaptive softmax, which adds its cluster head, its biases and an untied first projection
    layer = nn.ModuleList([nn.Linear(hidden, 3 * hidden, bias=False),
                           nn.Linear(hidden, hidden, bias=False), nn.Linear(hidden, hidden, bias=False),
                           nn.LayerNorm(hidden), nn.Linear(hidden, 4 * hidden),
                           nn.Linear(4 * hidden, hidden), nn.LayerNorm(hidden)])
    cutoffs, widths = (0, 19997, 39997, 199997, 267735), (1024, 256, 64, 16)
    adaptive = sum((hi - lo) * w + w * hidden
                   for lo, hi, w in zip(cutoffs[:-1], cutoffs[1:], widths, strict=True))
    softmax = 3 * hidden + 3 + cutoffs[-1] + hidden * hidden
    assert (18 * parameter_count(layer) + 2 * hidden + adaptive + softmax
            == PARAMETERS["transformer-xl-large"])
    for model, w in PRESETS["dgx2h-transformer-xl"].workloads.items():
        assert w.param_bytes == (2 if model.endswith("-amp") else 4) * PARAMETERS["transformer-xl-large"]
    for cal in PRESETS.values():
        assert cal.source and all(w.source for w in cal.workloads.values())
        assert cal.network.inter.bandwidth_Bps >= 0.9 * 10 * GBIT  # line rate x efficiency


def test_simulated_downpour_staleness_follows_the_protocol():
    from downpour_lib.perf.perfsim import simulate

    fast = Link(1e-6, 1e12)  # communication negligible: staleness from the schedule alone
    even = simulate("downpour", 2, compute_s=0.01, model_bytes=1e5, link=fast, steps=100)
    assert set(even.staleness_hist) <= {0, 1} and sum(even.staleness_hist.values()) == 200
    # a worker 4x slower sees about 4 of the other's updates between its fetch and its push
    slow = simulate("downpour", 2, compute_s=0.01, model_bytes=1e5, link=fast, steps=100,
                    slow_workers=1, slowdown=4.0)
    assert max(slow.staleness_hist) in (4, 5) and slow.makespan_s > 3.9 * even.makespan_s
    # bounded staleness: nothing staler than the bound is applied; the rest is refused
    bounded = simulate("downpour", 2, compute_s=0.01, model_bytes=1e5, link=fast, steps=100,
                       slow_workers=1, slowdown=4.0, max_staleness=0)
    assert set(bounded.staleness_hist) == {0} and bounded.refused > 0
    # warmstart: the second worker starts once the first has pushed 20 times, all of them fresh
    warm = simulate("downpour", 2, compute_s=0.01, model_bytes=1e5, link=fast, steps=100,
                    warmstart=20)
    assert warm.staleness_hist[0] >= 20 + even.staleness_hist[0] - 20
    assert warm.makespan_s == pytest.approx(even.makespan_s + 20 * 0.01, rel=0.01)
    # one server card carries every push: with many workers its queue sets the pace
    crowded = simulate("downpour", 64, compute_s=0.01, model_bytes=1e7, link=Link(1e-5, 1e9),
                       steps=20)
    assert crowded.server_busy > 0.9 and crowded.step_s > 0.9 * 64 * 1e7 / 1e9
    with pytest.raises(ConfigError, match="warmstart"):
        simulate("downpour", 2, compute_s=0.01, model_bytes=1, link=fast, warmstart=-1)
    # steps that vary break the phase lock: a wider distribution, the same one for the same seed
    jittered = simulate("downpour", 2, compute_s=0.01, model_bytes=1e5, link=fast, steps=100,
                        jitter=0.3, seed=1)
    assert len(jittered.staleness_hist) > len(even.staleness_hist)
    assert jittered == simulate("downpour", 2, compute_s=0.01, model_bytes=1e5, link=fast,
                                steps=100, jitter=0.3, seed=1)
    with pytest.raises(ConfigError, match="jitter"):
        simulate("downpour", 2, compute_s=0.01, model_bytes=1, link=fast, jitter=-0.1)


def test_simulated_staleness_matches_the_measured_study_on_average():
    """The staleness study's Downpour runs (committed reference), each simulated with its own
    settings and measured compute over the link fitted on the machine that measured them, with
    steps that vary by 1%: the mean staleness agrees within three quarters of an update or 25% (the
    simulation is ahead by about half an update where a worker pushes every step; the table reports
    the total variation distance, not asserted). A link fitted under load moved the deterministic
    simulation's fetch=4 push=1 mean from 3.37 to 3.78 updates (CI failed on it); the varying steps
    leave it within 0.06 from 1 us and 50 GB/s to 1 ms and 0.1 GB/s, and every run agrees at both."""
    cal = calib.calibrate(ROOT / "results" / "reference" / "model" / "collectives.json", REFERENCE)
    table, dists = calib.compare_staleness(cal.network.intra,
                                           ROOT / "results" / "reference" / "staleness")
    assert len(table) == 5 and table.agrees.all(), table.to_string()
    by = table.set_index("label")
    # pushing every step but fetching every 4th is far staler, measured and simulated alike
    for source in ("measured_mean", "simulated_mean"):
        assert by.loc["downpour S=1 fetch=4 push=1", source] > \
            4 * by.loc["downpour S=1 fetch=1 push=1", source]
    assert set(dists.source) == {"measured", "simulated"}
    assert dists.groupby(["label", "source"]).fraction.sum().round(6).eq(1).all()
    for link in (Link(1e-6, 50e9), Link(1e-3, 0.1e9)):
        elsewhere, _ = calib.compare_staleness(link, ROOT / "results" / "reference" / "staleness")
        assert elsewhere.agrees.all(), elsewhere.to_string()
        by_link = elsewhere.set_index("label").simulated_mean
        assert abs(by_link["downpour S=1 fetch=4 push=1"]
                   - by.loc["downpour S=1 fetch=4 push=1", "simulated_mean"]) < 0.1
    with pytest.raises(ConfigError, match="staleness"):
        calib.compare_staleness(cal.network.intra, ROOT / "results" / "reference" / "scaling")


def test_validate_exits_non_zero_when_a_prediction_is_outside_the_tolerance(capsys):
    """`downpour model validate` printed "worst error 49.0% (tolerance 15%)" and exited 0."""
    from downpour_lib.cli.model import verdict

    rows = [{"link": "100mbit", "algorithm": "allreduce", "error": 0.05},
            {"link": "100mbit", "algorithm": "diloco", "error": -0.49}]
    assert verdict(pd.DataFrame(rows), 0.15) == 1
    err = capsys.readouterr().err
    assert "49.0%" in err and "diloco at 100mbit -49.0%" in err and "15%" in err
    assert verdict(pd.DataFrame(rows[:1]), 0.15) == 0
    assert "within the tolerance of 15%" in capsys.readouterr().out


def test_calibrate_from_a_run_summary_predicts_that_run(tmp_path, capsys):
    """A user's own model: one real one-process `downpour train --summary-json`, calibrated with
    no study CSV and no --backend, predicts that run's measured step at one worker (its compute),
    and at two the ring allreduce of the model's parameters over the fitted link on top."""
    from downpour_lib.cli import main
    from downpour_lib.models import build_model, parameter_count

    summary = tmp_path / "lenet.json"
    proc = downpour("train", "--model", "lenet", "--dataset", "synthetic-cifar", "--algorithm",
                    "allreduce", "--steps", "12", "--warmup-steps", "4", "--eval-every", "0",
                    "--threads", "1", "--summary-json", str(summary), "--output-dir",
                    str(tmp_path / "run"))
    assert proc.returncode == 0, explain(proc)
    run = json.loads(summary.read_text())
    assert run["backend"] == "none" and run["num_workers"] == 1  # what made users say --backend
    collectives = ROOT / "results" / "reference" / "model" / "sandbox-2nodes" / \
        "collectives-100mbit.json"
    cal_path = tmp_path / "cal.json"
    assert main(["model", "calibrate", "--collectives", str(collectives), "--summary",
                 str(summary), "--out", str(cal_path)]) == 0
    out = capsys.readouterr().out
    assert "backend gloo (one process's run had no backend; a launch of several would use gloo)" \
        in out, out
    assert "predictions hide none of the allreduce" in out
    # the same run's steps.csv gives the spread a synchronous step waits on
    steps_csv = tmp_path / "run" / "steps.csv"
    assert main(["model", "calibrate", "--collectives", str(collectives), "--summary",
                 str(summary), "--steps", str(steps_csv), "--out", str(tmp_path / "j.json")]) == 0
    steps = pd.read_csv(steps_csv)
    busy = (steps.step_s - steps.comm_s - steps.wait_s)[steps.step >= 5]
    jitter = calib.load(tmp_path / "j.json").jitter
    assert jitter == pytest.approx(busy.std() / busy.mean()) and jitter > 0
    assert "step-time spread" in capsys.readouterr().out
    cal = calib.load(cal_path)
    w = cal.workload("lenet")
    assert w.batch_size == run["batch_size"]
    assert w.param_bytes == 4 * parameter_count(build_model("lenet", (3, 32, 32), 10))
    assert str(summary) in cal.source
    link, gamma = calib.fit_reduction(calib.read_collectives(collectives), "gloo")
    assert cal.network.intra == link and cal.network.gamma_s_per_byte == gamma
    assert cal.overlap == 0.0
    rows = tmp_path / "rows.json"
    assert main(["model", "predict", "--calibration", str(cal_path), "--model", "lenet",
                 "--workers", "1,2", "--json", str(rows)]) == 0
    one, two = json.loads(rows.read_text())
    assert one["step_s"] == pytest.approx(run["step_s"], rel=1e-9)  # the measured step, exactly
    ring = ring_allreduce_s(2, w.param_bytes, link) + w.param_bytes / 2 * gamma
    assert two["comm_s"] == pytest.approx(ring, rel=1e-9)
    assert two["step_s"] == pytest.approx(run["step_s"] + ring, rel=1e-9)


def write_own_model(where: Path) -> None:
    """A model of the user's, ``mine:build`` from ``where``: docs/own_model.md's two linear layers."""
    (where / "mine.py").write_text(
        "import math\nfrom torch import nn\n\n"
        "def build(input_shape, num_classes):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), 64), nn.ReLU(),\n"
        "                         nn.Linear(64, num_classes))\n")


def test_your_own_model_is_calibrated_and_predicted_by_its_import_path(tmp_path, capsys,
                                                                      monkeypatch):
    """docs/own_model.md's model, trained once by its import path as a user would, calibrated from
    that run's summary and predicted by the same name: the one-worker prediction is the measured
    step (``model predict`` refused the name, knowing only downpour's and the presets' models). A
    calibration without it says how to measure it, with the user's own data set."""
    from conftest import BIN, launch_env

    from downpour_lib.cli import main

    write_own_model(tmp_path)
    summary = tmp_path / "mine.json"
    proc = subprocess.run(
        [str(BIN / "downpour"), "train", "--model", "mine:build", "--dataset", "synthetic-cifar",
         "--algorithm", "allreduce", "--steps", "12", "--warmup-steps", "4", "--eval-every", "0",
         "--threads", "1", "--summary-json", str(summary)],
        env={**launch_env(), "PYTHONPATH": str(tmp_path)}, cwd=tmp_path, capture_output=True,
        text=True, timeout=240)
    assert proc.returncode == 0, explain(proc)
    run = json.loads(summary.read_text())
    assert run["model"] == "mine:build"
    monkeypatch.syspath_prepend(str(tmp_path))  # the user's directory, where the next two run
    collectives = ROOT / "results" / "reference" / "model" / "sandbox-2nodes" / \
        "collectives-100mbit.json"
    cal = tmp_path / "cal.json"
    assert main(["model", "calibrate", "--collectives", str(collectives), "--summary",
                 str(summary), "--out", str(cal)]) == 0
    rows = tmp_path / "rows.json"
    assert main(["model", "predict", "--calibration", str(cal), "--model", "mine:build",
                 "--workers", "1,2", "--json", str(rows)]) == 0
    one, two = json.loads(rows.read_text())
    assert one["step_s"] == pytest.approx(run["step_s"], rel=1e-9)
    assert two["comm_s"] > 0 and two["model"] == "mine:build"
    capsys.readouterr()
    other = ROOT / "results" / "reference" / "scaling" / "calibration.json"
    assert main(["model", "predict", "--calibration", str(other), "--model", "mine:build"]) == 2
    err = capsys.readouterr().err
    assert "has compute for inception_small only. Measure mine:build on this machine: `downpour " \
           "train --model mine:build --dataset YOURS" in err and "Traceback" not in err, err
    # a misspelling of yours is not a model to measure: the one the calibration has is named
    assert main(["model", "predict", "--calibration", str(cal), "--model", "mine:biuld"]) == 2
    assert "model='mine:biuld' is not valid: did you mean mine:build? It has compute for " \
           "mine:build only." in capsys.readouterr().err


def test_describe_counts_a_models_entry_for_a_hardware_file(tmp_path, capsys, monkeypatch):
    """`downpour model describe` prints what a hardware file needs of a model but its measured
    rate: ResNet-50's parameters, multiply-adds and gradient readiness as the presets hold them
    (counted the same way); yours, by its import path, pasted into a file, predicts. Without a
    data set for yours, or with a batch of 0, one line says what to give."""
    import yaml

    from downpour_lib.cli import main
    from downpour_lib.perf.hardware import hardware_from_dict

    assert main(["model", "describe", "--model", "resnet50"]) == 0
    out = capsys.readouterr().out
    assert "add images_per_s" in out
    entry = yaml.safe_load(out)["resnet50"]
    preset = PRESETS["horovod-pascal-25g"].workloads["resnet50"]
    assert entry["parameters"] == PARAMETERS["resnet50"] and entry["batch"] == 32
    assert tuple(entry["ready_at"]) == preset.ready_at
    assert entry["multiply_adds"] == pytest.approx(4.09e9, rel=1e-3)  # terms: ResNet-50 at 224
    assert "images_per_s" not in entry

    write_own_model(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["model", "describe", "--model", "mine:build", "--dataset", "synthetic-cifar",
                 "--batch", "64", "--images-per-s", "5000", "--source", "one V100"]) == 0
    mine = yaml.safe_load(capsys.readouterr().out)["mine:build"]
    assert mine["parameters"] == 3 * 32 * 32 * 64 + 64 + 64 * 10 + 10
    assert mine["multiply_adds"] == pytest.approx(3 * 32 * 32 * 64 + 64 * 10 + 64 + 10, rel=0.01)
    assert mine["images_per_s"] == 5000 and "one V100" in mine["source"]
    cal = hardware_from_dict({"devices_per_node": 8, "links": {
        "intra": {"gbit_per_s": 2400}, "inter": {"gbit_per_s": 200, "transport": "rdma"}},
        "models": {"mine:build": mine}})
    p = predict(cal, "allreduce", 64, "mine:build")
    assert 0 < p.efficiency_low <= p.efficiency <= p.efficiency_high <= 1.01

    # a language model built of torch's own transformer layers, a position table of its own
    (tmp_path / "encoder.py").write_text(
        "import torch\nfrom torch import nn\n\n"
        "class LM(nn.Module):\n"
        "    def __init__(self, context, vocabulary):\n"
        "        super().__init__()\n"
        "        self.embed = nn.Embedding(vocabulary, 64)\n"
        "        self.pos = nn.Parameter(torch.zeros(1, context, 64))\n"
        "        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(\n"
        "            64, 4, 256, batch_first=True, norm_first=True), 2, enable_nested_tensor=False)\n"
        "        self.head = nn.Linear(64, vocabulary)\n\n"
        "    def forward(self, tokens):\n"
        "        x = self.embed(tokens) + self.pos[:, :tokens.shape[1]]\n"
        "        return self.head(self.encoder(x, is_causal=False))\n\n"
        "def build(input_shape, num_classes):\n"
        "    return LM(input_shape[0], num_classes)\n")
    assert main(["model", "describe", "--model", "encoder:build", "--dataset", "stdlib-text",
                 "--images-per-s", "900"]) == 0
    lm = yaml.safe_load(capsys.readouterr().out)["encoder:build"]
    context, vocabulary = 128, 256
    layer = 4 * (64 * 64 + 64) + 2 * 64 * 256 + 256 + 64 + 4 * 64  # attention, MLP, 2 norms
    assert lm["parameters"] == vocabulary * 64 + context * 64 + 2 * layer + 64 * vocabulary + \
        vocabulary
    # a token's multiply-adds: the layers' weights, the head's, and attention over 128 tokens
    per_token = 2 * (4 * 64 * 64 + 2 * 64 * 256 + 2 * context * 64) + 64 * vocabulary
    assert lm["multiply_adds"] == pytest.approx(context * per_token, rel=1e-3)
    assert lm["node_compute"] == "none" and lm["ready_at"][-1] == 1.0
    assert lm["ready_at"][0] < 0.5 < lm["ready_at"][-2]  # the head first; the tables last

    assert main(["model", "describe", "--model", "mine:build"]) == 2
    assert "give --dataset" in capsys.readouterr().err
    assert main(["model", "describe", "--model", "resnet50", "--batch", "0"]) == 2
    assert "batch=0 is not valid: samples per worker per step" in capsys.readouterr().err


def test_the_backend_a_one_process_run_is_fitted_with():
    """A one-process run's summary says backend "none": fit what a launch of several would use
    under its launcher, or what the file measured; a run of several on an unmeasured backend is
    refused, naming the bench command that measures it."""
    rows = [{"backend": b, "op": "allreduce", "bytes": 1 << 20, "world_size": 2, "p50_s": 1e-3}
            for b in ("gloo", "mpi", "mpi4py")] + [{"backend": "memcpy", "world_size": 1}]
    alone = {"num_workers": [1], "backend": ["none"], "launcher": ["mpi"]}
    assert calib.pick_backend(pd.DataFrame(alone), rows)[0] == "mpi"
    assert calib.pick_backend(pd.DataFrame({**alone, "launcher": ["single"]}), rows)[0] == "gloo"
    assert calib.pick_backend(pd.DataFrame({**alone, "config_backend": ["gloo"]}), rows)[0] == "gloo"
    gloo_only = rows[:1]
    backend, why = calib.pick_backend(pd.DataFrame(alone), gloo_only, "c.json")
    assert backend == "gloo" and "would use mpi, which c.json has no rows of" in why
    several = pd.DataFrame({"num_workers": [1, 2], "backend": ["none", "mpi"],
                            "launcher": ["mpi", "mpi"]})
    assert calib.pick_backend(several, rows) == ("mpi", "the runs' mpi")
    with pytest.raises(ConfigError, match=r"backend='mpi' is not valid: the runs used mpi but c.json "
                                          r"measured \['gloo'\]: .*--backends mpi"):
        calib.pick_backend(several, gloo_only, "c.json")


def test_validate_takes_any_model_and_borrows_a_larger_sandbox(tmp_path):
    """`model validate` trained only the MLP, and refused the README's 3-node sandbox at its
    default of 2 nodes ("runs 3 node(s), not 2"): it now runs on 2 of a running sandbox's nodes.
    A sandbox that is not running is made with the count asked for."""
    from downpour_lib.study.model_validate import BASE, _config, sandbox_size

    config = _config({**BASE, "model": "resnet20", "batch_size": 16}, "localsgd")
    assert config.model == "resnet20" and config.data.batch_size == 16
    (tmp_path / "nodes").write_text("3\n")  # made with 3 nodes, not running
    assert sandbox_size(tmp_path, 2) == 2 and sandbox_size(tmp_path, 4) == 4
    assert sandbox_size(tmp_path / "none", 3) == 3


def test_validation_judges_each_algorithm_on_its_own_sittings_so_one_slow_spell_does_not_fail_it():
    """2 of 4 fresh-clone runs of a day failed the validation when a rate's last sitting was judged
    as a whole (issue 61): a slow spell in any one algorithm's runs there failed the run. Each
    algorithm is now judged on its first sitting within the tolerance; one that has none is
    reported at its median error, and fails. Every measured row is kept."""
    from downpour_lib.study.model_validate import TOLERANCE, judged_rows

    def sitting(n, errors):
        return [{"algorithm": name, "sitting": n, "error": e} for name, e in errors.items()]

    # each sitting had one algorithm in a slow spell: as a whole, every sitting missed
    spells = [sitting(1, {"allreduce": -0.30, "sgp": -0.05, "diloco": 0.02}),
              sitting(2, {"allreduce": -0.04, "sgp": -0.22, "diloco": 0.05}),
              sitting(3, {"allreduce": 0.03, "sgp": -0.01, "diloco": -0.19})]
    assert all(any(abs(r["error"]) > TOLERANCE for r in these) for these in spells)
    judged, others = judged_rows(spells)
    assert [(r["algorithm"], r["sitting"], r["error"]) for r in judged] == [
        ("allreduce", 2, -0.04), ("sgp", 1, -0.05), ("diloco", 1, 0.02)]
    assert len(judged) + len(others) == 9
    # a model that is off in every sitting still fails, at its median error
    off = [sitting(n, {"diloco": e}) for n, e in ((1, -0.19), (2, -0.30), (3, -0.18))]
    assert judged_rows(off)[0] == [{"algorithm": "diloco", "sitting": 1, "error": -0.19}]
    # a rate that agreed at once is one sitting, its rows as measured
    assert judged_rows([spells[0][1:]]) == (spells[0][1:], [])


def test_validation_measures_the_unshaped_steps_again_when_a_shaped_link_undercut_them():
    """A fresh-clone CI run beside other work measured DiLoCo's unshaped step besides the link at
    7.7 ms (2.9-3.3 is usual), then 6.7 and 10.2 ms a step over links shaped to 200 and 100mbit: a
    shaped link only adds time, so that baseline was a slow spell's, and every sitting missed by
    42-64 %. Such an algorithm asks for the unshaped steps to be measured again; one that missed
    over a link slower than predicted, or agreed, does not."""
    from downpour_lib.study.model_validate import undercut_baseline

    def row(name, measured, besides, error):
        return {"algorithm": name, "measured_step_s": measured, "besides_link_s": besides,
                "error": error}

    judged = [row("diloco", 0.0067, 0.00767, 0.636), row("sgp", 0.020, 0.004, -0.30),
              row("allreduce", 0.0035, 0.004, 0.05)]
    assert undercut_baseline(judged) == ["diloco"]
    assert undercut_baseline(judged[1:]) == []


def test_validation_measures_a_step_by_its_periods_so_one_stall_does_not_move_it():
    """A CI run's DiLoCo at 100mbit measured twice its prediction from a mean that a stall in one
    of eight meetings moves by 13%: the measured step is now the median of the periods' means.
    Without stalls it is the mean; each period holds one meeting wherever the window starts."""
    import pandas as pd

    from downpour_lib.study.model_validate import typical_step_s

    def run(times, warmup=2):
        steps = [(rank, "worker", step, t) for step, t in enumerate([9.0] * warmup + times)
                 for rank in (0, 1)]
        return pd.DataFrame(steps, columns=["rank", "role", "step", "step_s"])

    period = [0.002] * 19 + [0.14]  # DiLoCo at 100mbit: 19 local steps, then a meeting
    steady = period * 8
    assert typical_step_s(run(steady), 2, 20) == pytest.approx(sum(steady) / len(steady))
    stalled = list(steady)
    stalled[59] += 0.2  # a retransmission timeout in the third meeting
    assert sum(stalled) / len(stalled) > 1.13 * typical_step_s(run(stalled), 2, 20)
    assert typical_step_s(run(stalled), 2, 20) == pytest.approx(sum(steady) / len(steady))
    shifted = steady[5:] + steady[:5]  # measured from mid-period: still one meeting a period
    assert typical_step_s(run(shifted), 2, 20) == pytest.approx(sum(steady) / len(steady))
    assert typical_step_s(run([0.07, 0.5, 0.071, 0.069]), 2, 1) == pytest.approx(0.0705)


def test_every_registered_algorithm_declares_what_it_sends_and_the_model_reads_it():
    """The model lists no algorithm names: each options class declares its ``traffic`` and the
    model takes the registry's algorithms and their options' defaults."""
    from downpour_lib.algorithms import ALGORITHMS as REGISTRY
    from downpour_lib.perf.perfmodel import MODELLED_ALGORITHMS, TRAFFIC, options_for, traffic

    assert set(MODELLED_ALGORITHMS) == set(REGISTRY) - {"local"}
    for name in MODELLED_ALGORITHMS:
        assert traffic(name) in TRAFFIC, name
    assert traffic("easgd") == "periodic" and traffic("easgd_async") == "async_push_pull"
    assert traffic("allreduce") == "collective" and traffic("osgp") == "overlapped_gossip"
    # defaults are the options classes': diloco's period is its own, not localsgd's
    assert options_for("diloco")["period"] == REGISTRY["diloco"].Options().period == 20
    assert options_for("localsgd")["period"] == 4
    assert options_for("downpour", {"servers": 4})["servers"] == 4


def test_slow_workers_and_step_spread_make_a_synchronous_step_wait():
    """`--option allreduce.slow_workers=1 --option allreduce.slowdown=2` was accepted and
    ignored; now the step waits for the slow worker, and a step-time spread makes the slowest
    of N later as N grows (1 + cv e_N, e_N the expected largest of N standard normals)."""
    from downpour_lib.perf.terms import expected_max_of_normals, straggler_factor

    cal = toy(overlap=0.0)
    plain = predict(cal, "allreduce", 8, "m")
    slow = predict(cal, "allreduce", 8, "m", {"slow_workers": 1, "slowdown": 2})
    assert slow.step_s == pytest.approx(plain.step_s + 0.1) and slow.straggler == 2
    assert slow.comm_s == pytest.approx(plain.comm_s)
    # each bucket goes once every worker has it, so the slow worker's longer backward hides more
    # of an allreduce that outlasts backward: it costs half its compute again here, and all of it
    # where the allreduce hides behind backward either way (a step ten times as long)
    for compute_s, costs in ((0.1, 0.05), (1.0, 1.0)):
        hides = toy(overlap=1.0, compute_s=compute_s)
        plain, slow = (predict(hides, "allreduce", 8, "m", o)
                       for o in ({}, {"slow_workers": 1, "slowdown": 2}))
        assert slow.step_s - plain.step_s == pytest.approx(costs)
    with pytest.raises(ConfigError, match="slowdown"):
        predict(cal, "allreduce", 8, "m", {"slow_workers": 1, "slowdown": 0.5})
    with pytest.raises(ConfigError, match="slow_workers.*workers=8"):
        predict(cal, "allreduce", 8, "m", {"slow_workers": 9, "slowdown": 2})
    spread = replace(cal, jitter=0.1)
    steps = {n: predict(spread, "allreduce", n, "m").step_s - predict(cal, "allreduce", n, "m").step_s
             for n in (2, 8, 512)}
    assert 0 < steps[2] < steps[8] < steps[512]
    assert steps[512] == pytest.approx(0.1 * 0.1 * expected_max_of_normals(512))
    assert straggler_factor(1, 0.5) == 1
    # e_N against its closed forms (N = 2, 3) and against draws (N = 512; the asymptote
    # sqrt(2 ln N) it replaced is 3.53 there, 1.18 at N = 2)
    assert expected_max_of_normals(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-9)
    assert expected_max_of_normals(3) == pytest.approx(3 / (2 * math.sqrt(math.pi)), abs=1e-9)
    draws = np.random.default_rng(0).standard_normal((20000, 512)).max(axis=1)
    assert expected_max_of_normals(512) == pytest.approx(draws.mean(), abs=0.015)
    assert abs(expected_max_of_normals(512) - math.sqrt(2 * math.log(512))) > 0.4
    # the asynchronous ones get the spread as the simulation's jitter: no barrier to wait at
    assert predict(spread, "downpour", 4, "m", steps=20).straggler == 1


def given_is_a_point(spec: dict, name: str, value: float) -> None:
    """A spread a hardware file (or with_fields) gives is measured: a point, its range gone; a bad
    one names the field."""
    from downpour_lib.perf.hardware import hardware_from_dict, with_fields

    given = hardware_from_dict(dict(spec, **{name: value}))
    assert (getattr(given, name), getattr(given, f"{name}_high")) == (value, None)
    for bad in (-0.01, "some", True, float("nan")):
        with pytest.raises(ConfigError, match=name):
            hardware_from_dict(dict(spec, **{name: bad}))
    cal = hardware_from_dict(spec)
    with pytest.raises(ConfigError, match=name):
        with_fields(cal, **{name: -1})
    assert getattr(with_fields(cal, **{name: 0.0}), f"{name}_high") is None


def test_the_devices_own_spread_waits_at_every_accumulation_and_is_a_range_from_its_source():
    """Issue 65, item 3: a step's jitter averages out over the passes a step accumulates (their
    sum's spread shrinks as 1/sqrt(passes)); a device slower than its peers stays slower, so the
    slowest of N sets every synchronous step whatever it accumulates. Not measured, the devices'
    spread is a range (terms.DEVICE_SPREAD_RANGE: Sinha et al.'s 8 % average variation among GPUs
    of one SKU, read as a normal's box-plot whiskers), recomputed here; given, it is a point."""
    from statistics import NormalDist

    from downpour_lib.perf.hardware import HARDWARE_DIR, hardware_from_dict, read_hardware
    from downpour_lib.perf.terms import DEVICE_SPREAD_RANGE, straggler_factor

    q1, q3 = NormalDist().inv_cdf(0.25), NormalDist().inv_cdf(0.75)
    whiskers = (q3 + 1.5 * (q3 - q1)) - (q1 - 1.5 * (q3 - q1))
    assert DEVICE_SPREAD_RANGE == pytest.approx((0.0, 0.08 / whiskers))
    assert 0.014 < DEVICE_SPREAD_RANGE[1] < 0.015

    base = toy(per_node=8, overlap=0.0)
    deep = replace(base, workloads={"m": replace(base.workloads["m"], accumulation=64)})
    for cal, passes in ((base, 1), (deep, 64)):
        jittery = predict(replace(cal, jitter=0.08), "allreduce", 256, "m")
        uneven = predict(replace(cal, device_spread=0.02), "allreduce", 256, "m")
        assert jittery.straggler == pytest.approx(straggler_factor(256, 0.08 / math.sqrt(passes)))
        assert uneven.straggler == pytest.approx(straggler_factor(256, 0.02)), passes
        both = predict(replace(cal, jitter=0.08, device_spread=0.02), "allreduce", 256, "m")
        assert both.straggler == pytest.approx(
            straggler_factor(256, math.hypot(0.08 / math.sqrt(passes), 0.02)))
    uneven = replace(base, device_spread=0.02)
    waits = [predict(uneven, "allreduce", n, "m").straggler for n in (1, 8, 64, 512)]
    assert waits[0] == 1 and waits == sorted(waits) and len(set(waits)) == 4
    assert predict(uneven, "downpour", 4, "m", steps=20).straggler == 1  # no barrier to wait at

    # a hardware file that does not give it: the range, each end bounding the band
    spec = read_hardware(HARDWARE_DIR / "dgx-a100-bert.yaml")
    cal = hardware_from_dict(spec)
    assert (cal.device_spread, cal.device_spread_high) == DEVICE_SPREAD_RANGE
    p = predict(cal, "allreduce", 256, "bert-large-512-amp")
    ends = [predict(replace(cal, device_spread=v, device_spread_high=None), "allreduce", 256,
                    "bert-large-512-amp") for v in DEVICE_SPREAD_RANGE]
    assert ends[1].straggler > ends[0].straggler > 1  # the jitter's range is left in both
    assert p.efficiency_low < p.efficiency < p.efficiency_high
    given_is_a_point(spec, "device_spread", 0.01)


def test_the_nodes_spread_costs_only_across_nodes_and_is_the_rest_of_the_clusters():
    """A node's devices share its node's speed (its power, cooling, host): across nodes a
    synchronous step also waits for the slowest node (terms.straggler_factor's node_cv). It is
    exact where either spread is 0 or a node has one worker, checked against draws between; one
    node's devices never pay it, so the one-node tables the model is fitted on are given back as
    before. Not measured, it is a range (terms.NODE_SPREAD_RANGE): at both unfavourable ends a
    cluster's devices spread as Sinha et al.'s most uneven cluster (22 %), of which the devices'
    own range holds 8 %; given (node_spread, --node-spread), it is a point."""
    from downpour_lib.perf.hardware import HARDWARE_DIR, hardware_from_dict, read_hardware
    from downpour_lib.perf.terms import (
        DEVICE_SPREAD_RANGE,
        DEVICE_SPREAD_WHISKER,
        NODE_SPREAD_RANGE,
        expected_max_of_normals,
        sd_max_of_normals,
        straggler_factor,
    )

    draws = np.random.default_rng(1).standard_normal((40000, 8)).max(axis=1)
    assert sd_max_of_normals(8) == pytest.approx(draws.std(), abs=0.01) and sd_max_of_normals(1) == 1
    assert straggler_factor(256, 0.02, 0.0, 8) == straggler_factor(256, 0.02)
    assert straggler_factor(8, 0.02, 0.05, 8) == straggler_factor(8, 0.02)  # one node: none
    # a node of one worker: its time is the sum of two independent normals
    assert straggler_factor(32, 0.02, 0.03, 1) == pytest.approx(
        1 + math.hypot(0.02, 0.03) * expected_max_of_normals(32))
    # nodes of 8: the expected slowest of 256 drawn times, within a third of a point (the
    # slowest of a node's 8 is skewed, not normal: the sum reads it a little slow)
    rng = np.random.default_rng(2)
    times = 1 + 0.03 * rng.standard_normal((4000, 32, 1)) + 0.015 * rng.standard_normal((4000, 32, 8))
    drawn = times.max(axis=(1, 2)).mean()
    assert drawn < straggler_factor(256, 0.015, 0.03, 8) < drawn + 0.003
    with pytest.raises(ConfigError, match="node_spread"):
        straggler_factor(16, 0.01, -0.01, 8)

    total = math.hypot(DEVICE_SPREAD_RANGE[1], NODE_SPREAD_RANGE[1]) * 2 * DEVICE_SPREAD_WHISKER
    assert NODE_SPREAD_RANGE[0] == 0 and total == pytest.approx(0.22)
    assert 0.037 < NODE_SPREAD_RANGE[1] < 0.039

    spec = read_hardware(HARDWARE_DIR / "dgx-a100-bert.yaml")
    cal = hardware_from_dict(spec)
    assert (cal.node_spread, cal.node_spread_high) == NODE_SPREAD_RANGE
    even = replace(cal, node_spread_high=None)
    for workers, moved in ((8, False), (16, True), (256, True)):
        ranged, alike = (predict(c, "allreduce", workers, "bert-large-512") for c in (cal, even))
        assert (ranged.efficiency_low < alike.efficiency_low) == moved, workers
        assert ranged.efficiency_high == alike.efficiency_high  # the favourable end: alike
    given_is_a_point(spec, "node_spread", 0.02)


def test_spreads_from_steps_recovers_the_three_levels_it_was_drawn_with(tmp_path):
    """`downpour model spread`'s reading (calib.spreads_from_steps): a steps.csv drawn with a
    node's, a device's and a step's own spread (64 hosts of 4 workers, 40 steps past the warm-up)
    gives each back within a fifth; the servers' rows and the warm-up are left out; a file without
    hosts, or with one worker a host, says what it cannot tell. Bad files name `steps`."""
    rng = np.random.default_rng(7)
    hosts, per, steps, node, device, jitter = 64, 4, 45, 0.03, 0.015, 0.05
    node_of = node * rng.standard_normal(hosts)
    device_of = device * rng.standard_normal((hosts, per))
    rows = [{"rank": 1 + h * per + d, "role": "worker", "step": k, "comm_s": 0.01, "wait_s": 0.0,
             "step_s": 0.01 + 0.2 * (1 + node_of[h] + device_of[h, d] + jitter * rng.standard_normal()),
             "host": f"node{h:02d}"} for h in range(hosts) for d in range(per) for k in range(steps)]
    rows += [{"rank": 0, "role": "server", "step": k, "comm_s": 0.0, "wait_s": 0.0, "step_s": 9.0,
              "host": "node00"} for k in range(steps)]
    rows += [{**r, "step_s": 5.0} for r in rows[:per * steps] if r["step"] < 5]  # ignored: warm-up
    path = tmp_path / "steps.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    s = calib.spreads_from_steps(path)
    assert (s.ranks, s.hosts, s.steps) == (hosts * per, hosts, steps - 5)
    assert s.jitter == pytest.approx(jitter, rel=0.05)
    assert s.device_spread == pytest.approx(device, rel=0.2)
    assert s.node_spread == pytest.approx(node, rel=0.2)
    # one worker a host: the devices' spread is the nodes' (the two cannot be told apart)
    pd.DataFrame([r for r in rows if r["rank"] % per == 1]).to_csv(path, index=False)
    alone = calib.spreads_from_steps(path)
    assert alone.device_spread is None and alone.node_spread == pytest.approx(
        math.hypot(node, device), rel=0.25)
    # no host column (a run of an earlier version): no nodes' spread, and hosts 0
    pd.DataFrame(rows).drop(columns="host").to_csv(path, index=False)
    unnamed = calib.spreads_from_steps(path)
    assert (unnamed.hosts, unnamed.node_spread) == (0, None) and unnamed.device_spread > device
    for text, what in (("rank,step\n1,6\n", "no step_s column"),
                       ("rank,step,step_s\n1,0,0.1\n1,1,0.1\n", "no worker's step past")):
        path.write_text(text)
        with pytest.raises(ConfigError, match=what):
            calib.spreads_from_steps(path)
    with pytest.raises(ConfigError, match="steps=.*no such file"):
        calib.spreads_from_steps(tmp_path / "none.csv")


def test_model_spread_reads_a_slow_workers_run(tmp_path):
    """A real run of 3 MPI ranks whose last worker is 3 times slower (--slow-workers 1: it sleeps
    beside its compute, as a slower device would) writes each rank's host beside its steps, and
    `downpour model spread` on its steps.csv gives the hardware file's lines: that worker's
    spread as the devices', and no nodes' spread from one host, saying why. The compute is
    emulated (0.1 s sleeps; the allreduce is real): this model's real step is about 1.5 ms, which
    a loaded machine's overheads swamp (one make test's run read 0.28 for 0.69, its jitter 0.57)."""
    out = tmp_path / "run"
    proc = mpiexec(3, str(BIN / "downpour"), "train", "--algorithm", "allreduce", "--steps", "12",
                   "--warmup-steps", "2", "--eval-every", "0", "--threads", "1", "--slow-workers",
                   "1", "--slowdown", "3", "--compute", "emulated", "--emulated-step-s", "0.1",
                   "--output-dir", str(out))
    assert proc.returncode == 0, explain(proc)
    steps = pd.read_csv(out / "steps.csv")
    assert steps["host"].nunique() == 1 and steps["host"].notna().all(), steps
    s = calib.spreads_from_steps(out / "steps.csv", warmup_steps=2)
    busy = (steps.step_s - steps.comm_s - steps.wait_s)[steps.step >= 2].groupby(steps["rank"]).mean()
    assert (s.ranks, s.hosts) == (3, 1) and s.node_spread is None
    # the ranks' mean compute spreads by the devices' variance plus the 1/n of a step's own that a
    # mean of n steps keeps: a loaded machine's noisier steps move the share between the two, not
    # the sum
    assert s.device_spread ** 2 + s.jitter ** 2 / s.steps == pytest.approx(
        (busy.std() / busy.mean()) ** 2, rel=1e-9)
    # the worker 3 times slower: the sample spread of (1, 1, 3) is 0.69 of their mean (0.69 here,
    # 0.69 beside four busy loops); a step's overheads, the same on every rank, would lower it
    assert 0.55 < s.device_spread < 0.75, s
    proc = downpour("model", "spread", str(out / "steps.csv"), "--warmup-steps", "2")
    assert proc.returncode == 0, explain(proc)
    assert f"device_spread: {s.device_spread:.4f}" in proc.stdout, proc.stdout
    assert "# node_spread: not measured (every worker ran on one host" in proc.stdout
    assert proc.stdout.count("\njitter: ") == 1


def test_a_collective_per_size_and_n_and_a_crowded_node():
    """auto is NCCL's tuner: the least of its algorithms under its protocols, a tree with LL where
    latency dominates (small messages, many ranks), a ring with Simple where bytes do, as NCCL's
    maintainers describe its choices (nccl#754: "tree/LL -> ring/LL -> ... ring/simple"); on one
    node the ranks share its memory and cores (issue 34: comm grew 2.5 -> 363 ms from 2 to 32
    ranks on 2 cores), so per-rank comm grows with ranks instead of staying flat."""
    from downpour_lib.perf.netmodel import nccl_choices

    net = Network(Link(1e-6, 100e9), Link(1e-5, 10e9), per_node=8)

    def chosen(n, size):
        times = nccl_choices(n, size, net)
        assert allreduce_s(n, size, net, "auto") == min(times.values())
        return min(times, key=times.get)

    assert chosen(1024, 1e3) == chosen(16, 1e3) == ("tree", "LL")
    assert chosen(8, 1e3) == ("ring", "LL")  # one node: no tree
    assert chosen(16, 1e8) == chosen(1024, 1e9) == chosen(8, 1e9) == ("ring", "Simple")
    # a protocol's bytes never move faster than Simple's, its hops never cost more than Simple's
    for n in (8, 16, 1024):
        big = nccl_choices(n, 1e10, net)
        assert big["ring", "Simple"] < big["ring", "LL128"] < big["ring", "LL"]
        small = nccl_choices(n, 8, net)
        assert small["ring", "LL"] < small["ring", "Simple"]
    free = Network(Link(1e-4, 4e9), Link(1e-4, 4e9), per_node=32)
    crowded = replace(free, gamma_s_per_byte=1e-9, node_Bps=14e9, cores=2)
    grow = {n: allreduce_s(n, 6.6e6, crowded) / allreduce_s(n, 6.6e6, free) for n in (2, 8, 32)}
    assert 1 < grow[2] < grow[8] < grow[32] and grow[32] > 10
    assert allreduce_s(2, 6.6e6, crowded) == pytest.approx(
        ring_allreduce_s(2, 6.6e6, free.intra) + 6.6e6 / 2 * 1e-9)
    with pytest.raises(ConfigError, match="cores"):
        replace(free, cores=0)


def test_overlap_not_measured_gives_a_band_and_measured_a_point():
    cal = toy(overlap=None)
    p = predict(cal, "allreduce", 8, "m")
    from downpour_lib.perf.terms import OVERLAP_RANGE

    none, ideal = (predict(toy(overlap=OVERLAP_RANGE[0]), "allreduce", 8, "m"),
                   predict(toy(overlap=OVERLAP_RANGE[1]), "allreduce", 8, "m"))
    assert p.step_s_high == pytest.approx(none.step_s) and p.step_s_low == pytest.approx(ideal.step_s)
    assert p.efficiency_low < p.efficiency < p.efficiency_high
    # the point is the middle of what a user reads, the efficiency (and the samples a second)
    assert p.efficiency == pytest.approx((none.efficiency + ideal.efficiency) / 2)
    assert p.samples_per_s == pytest.approx((none.samples_per_s + ideal.samples_per_s) / 2)
    assert p.step_s_low < p.step_s < p.step_s_high
    assert ideal.step_s_low == ideal.step_s == ideal.step_s_high
    back = Calibration.from_dict(json.loads(json.dumps(replace(cal, jitter=0.2).to_dict())))
    assert back == replace(cal, jitter=0.2)


def test_hardware_files_are_the_presets_and_bad_fields_are_named(tmp_path):
    from downpour_lib.perf.hardware import HARDWARE_DIR, hardware_from_dict, load_hardware, with_fields
    from downpour_lib.perf.terms import FRAMEWORK_MACS_PER_PARAMETER, transport_rate

    assert {p.stem for p in HARDWARE_DIR.glob("*.yaml")} == set(PRESETS)
    sgp = PRESETS["sgp-v100-10g"]
    assert sgp.network.inter.bandwidth_Bps == pytest.approx(10 * GBIT * sum(transport_rate("tcp", 10)) / 2)
    assert sgp.overlap is None and "Assran" in sgp.source
    # a file's and the flags' TCP range is that of the ranks a node puts on the card
    tcp = {"devices_per_node": 4, "links": {"inter": {"gbit_per_s": 25, "transport": "tcp"}},
           "models": {"net": {"batch": 32, "step_s": 0.2, "parameters": 1e6}}}
    shared = sum(transport_rate("tcp", 25, per_node=4)) / 2
    assert hardware_from_dict(tcp).network.inter.bandwidth_Bps == pytest.approx(25 * GBIT * shared)
    flags = with_fields(PRESETS["horovod-pascal-25g"], inter_gbit=25, inter_transport="tcp")
    assert flags.network.inter.bandwidth_Bps == pytest.approx(25 * GBIT * shared)
    assert flags.source.endswith("RoCE 25 Gbit/s (published); assumed 10 us per message; "
                                 "given: inter_gbit=25, inter_transport=tcp"), flags.source
    alone = with_fields(flags, devices_per_node=1, inter_gbit=25, inter_transport="tcp")
    assert alone.network.inter.bandwidth_Bps == pytest.approx(25 * GBIT * sum(transport_rate("tcp", 25)) / 2)
    spec = {"name": "mine", "devices_per_node": 4, "overlap": 0.5,
            "links": {"inter": {"gbit_per_s": 25, "latency_us": 10, "efficiency": 0.9}},
            "models": {"net": {"batch": 32, "step_s": 0.2, "parameters": 1e6}}}
    cal = hardware_from_dict(spec)
    assert cal.network.inter.alpha_s == pytest.approx(1e-5) and cal.network.per_node == 4
    assert cal.network.inter.bandwidth_Bps == pytest.approx(25 * GBIT * 0.9)
    assert cal.workloads["net"].compute_s == pytest.approx(0.2) and cal.overlap == 0.5
    assert cal.framework is None and hardware_from_dict(dict(spec, framework=2)).framework == 2.0
    for bad, field in ((dict(spec, devices_per_node=0), "devices_per_node"),
                       (dict(spec, overlap=2), "overlap"),
                       (dict(spec, links={"inter": {"gbit_per_s": -1}}), "links.inter.gbit_per_s"),
                       (dict(spec, links={"inter": {"gbit_per_s": 1, "efficiency": 2}}),
                        "links.inter.efficiency"),
                       (dict(spec, models={"net": {"batch": 32, "parameters": 1}}), "models.net"),
                       (dict(spec, framework=-1), "framework"),
                       (dict(spec, framework="some"), "framework"),
                       (dict(spec, colective="ring"), "hardware.*colective"),
                       # a model's field at the top, a link's: said where it goes
                       (dict(spec, accumulation=4), "accumulation.*a field of each model"),
                       (dict(spec, gbit_per_s=25), "gbit_per_s.*links.intra or links.inter"),
                       (dict(spec, models={"net": {"batch": 32, "step_s": 0.2}}),
                        r"models\.net\.parameters is missing: give the model's parameter count"),
                       (dict(spec, models={"net": {"step_s": 0.2, "parameters": 1}}),
                        r"models\.net\.batch is missing: give samples per worker per pass"),
                       (dict(spec, links={"inter": {"gbit_per_s": 1, "transport": "infiniband"}}),
                        "links.inter.transport='infiniband'.*InfiniBand, RoCE: rdma"),
                       (dict(spec, links={"inter": {"gbit_per_s": 1, "efficiency": "published"}}),
                        "links.inter.transport is missing"),
                       (dict(spec, models={"net": {**spec["models"]["net"], "multiply_adds": "lots"}}),
                        "models.net.multiply_adds")):
        with pytest.raises(ConfigError, match=field):
            hardware_from_dict(bad)
    path = tmp_path / "mine.yaml"
    import yaml

    path.write_text(yaml.safe_dump(spec))
    assert load_hardware(path) == cal
    # multiply-adds as people write them (YAML 1.1 alone reads 4.09e9 as a string): a sample of
    # 4.09e9 on a 1e6-parameter model is 4090 a parameter, its framework's unit 172/4090 of a sample
    path.write_text(yaml.safe_dump(spec).replace("parameters: 1000000.0", "parameters: 1000000.0\n"
                                                 "    multiply_adds: 4.09e9"))
    unit = load_hardware(path).workloads["net"].framework_sample_s
    assert unit == pytest.approx(0.2 / 32 * FRAMEWORK_MACS_PER_PARAMETER * 1e6 / 4.09e9)
    with pytest.raises(ConfigError, match="hardware"):
        load_hardware(tmp_path / "none.yaml")


def test_predict_takes_a_hardware_file_and_flags(tmp_path, capsys):
    from downpour_lib.cli import main

    hw = Path(__file__).parents[1] / "downpour_lib" / "perf" / "hardware" / "sgp-v100-10g.yaml"
    rows_at = tmp_path / "rows.json"
    assert main(["model", "predict", "--hardware", str(hw), "--model", "resnet50", "--workers",
                 "32", "--json", str(rows_at)]) == 0
    (base,) = json.loads(rows_at.read_text())
    assert "efficiency_low" in capsys.readouterr().out
    assert base["efficiency_low"] < base["efficiency"] < base["efficiency_high"]
    assert main(["model", "predict", "--hardware", str(hw), "--model", "resnet50", "--workers",
                 "32", "--inter-gbit", "100", "--link-efficiency", "0.95", "--overlap", "1",
                 "--jitter", "0", "--framework",
                 "2.5", "--node-compute", "0.01,0.1", "--device-spread", "0.01", "--node-spread",
                 "0.02", "--json", str(rows_at)]) == 0
    (fast,) = json.loads(rows_at.read_text())
    assert fast["efficiency"] > base["efficiency_high"]
    assert fast["efficiency_low"] == fast["efficiency"] == fast["efficiency_high"]  # all measured
    assert main(["model", "predict", "--hardware", str(hw), "--model", "resnet50", "--workers",
                 "32", "--inter-gbit", "10", "--json", str(rows_at)]) == 0
    (again,) = json.loads(rows_at.read_text())  # its own rate by flag: its TCP range kept
    assert again == base
    assert main(["model", "predict", "--hardware", str(hw), "--model", "resnet50", "--workers",
                 "32", "--jitter", "0.1", "--option", "allreduce.slow_workers=1", "--option",
                 "allreduce.slowdown=2", "--json", str(rows_at)]) == 0
    (slow,) = json.loads(rows_at.read_text())
    # the slow worker's compute is waited for; its longer backward hides more of the allreduce
    # this 10 Gbit/s link leaves exposed, so the step grows by less than that compute again, and
    # by no less than its forward (a third of it), which hides nothing
    grew = slow["step_s"] - base["step_s"]
    assert base["compute_s"] / 3 <= grew < base["compute_s"]


def test_node_compute_is_a_share_of_the_step_by_precision_not_the_rate_or_the_cores():
    """A busy node costs each of its devices a share of the step set by the precision they run
    at (issue 35's law in samples per second per host core, and issue 65's range on it, are
    gone): NVIDIA's 21.03 tables (presets.DLE_2103_CHECKS, the DataLoader of configs.yml) lose
    alike at a precision across three models and two node types, where the rate alone differs
    more than five times and the host's cores per GPU 3.2 times; mixed precision loses more than
    full precision everywhere. The share grows with log2 of the devices in use."""
    from downpour_lib.perf.hardware import hardware_from_dict
    from downpour_lib.perf.presets import DLE_2103_CHECKS, DLE_CHECKS
    from downpour_lib.perf.terms import NodeCompute

    rows = [r for r in DLE_CHECKS] + [r for rows in DLE_2103_CHECKS.values() for r in rows]
    assert len(rows) == 18
    loss = {"fp32": [], "amp": []}
    rate = {"fp32": [], "amp": []}
    for _, model, _, one, eight in rows:
        precision = "amp" if model.endswith("-amp") else "fp32"
        loss[precision].append(8 * one / eight - 1)
        rate[precision].append(one)
    assert max(rate["amp"]) / min(rate["amp"]) > 5 and max(rate["fp32"]) / min(rate["fp32"]) > 3
    assert max(loss["amp"]) / min(loss["amp"]) < 1.6 and max(loss["fp32"]) / min(loss["fp32"]) < 2.1
    assert max(loss["fp32"]) < min(loss["amp"])
    # the law: a share at the fitted devices, log2 of the devices in use below it
    node = NodeCompute(fp32=0.01, amp=0.12, at=8)
    assert node.efficiency(1, "amp") == 1 and node.efficiency(8, "fp32") == pytest.approx(1 / 1.01)
    assert node.efficiency(4, "amp") == pytest.approx(1 / (1 + 0.12 * 2 / 3))
    assert NodeCompute().efficiency(8, "amp") == 1  # none: a measured calibration's
    with pytest.raises(ConfigError, match="precision='bf16'.*fp32, amp"):
        node.efficiency(8, "bf16")
    # the host's cores no longer change it; a model's precision does, in one line when wrong
    spec = {"devices_per_node": 8, "links": {"intra": {"gbit_per_s": 1200}},
            "models": {"net": {"batch": 256, "images_per_s": 2470, "parameters": 1e6,
                               "precision": "amp"}}}
    on = {cores: predict(hardware_from_dict(dict(spec, host={"cores": cores})), "allreduce", 8, "net")
          for cores in (40, 128)}
    assert on[40].compute_efficiency == on[128].compute_efficiency
    fitted = PRESETS["dgx1-v100"].node_compute

    def middle(node, devices, precision):  # a range's point: the middle of its two ends
        return sum(node.end(end).efficiency(devices, precision) for end in (0, 1)) / 2

    assert on[40].compute_efficiency == pytest.approx(middle(fitted, 8, "amp"))
    # the DataLoader's shares are a range: the same benchmark, node, batches and loader lose more
    # under pytorch-20.12 than under 21.03, by more than a point at each precision; its ends are
    # the two tables', and a calibration's JSON keeps them
    from downpour_lib.perf.terms import DGX1_2012_TABLE, DGX1_TABLE

    def lost(table, precision):
        one, eight = (r.images_per_s for r in table if r.precision == precision)
        return 8 * one / eight - 1

    for precision in ("fp32", "amp"):
        assert lost(DGX1_2012_TABLE, precision) > lost(DGX1_TABLE, precision) + 0.01
        assert getattr(fitted, precision) < getattr(fitted, precision + "_high")
    # and so do the other rows of those READMEs (docs/perf_model.md), but one
    from downpour_lib.perf.presets import DLE_2012_CHECKS

    newer = {(r[0], r[1]): r[4] / r[3] for r in rows}
    gained = [(r[0], r[1]) for rows_ in DLE_2012_CHECKS.values() for r in rows_
              if r[4] / r[3] >= newer[r[0], r[1]]]
    assert len(newer) == 18 and gained == [("dgx-a100", "resnet50")], gained
    assert Calibration.from_dict(json.loads(json.dumps(PRESETS["dgx1-v100"].to_dict()))) \
        == PRESETS["dgx1-v100"]
    full = dict(spec, models={"net": {**spec["models"]["net"], "precision": "fp32"}})
    assert predict(hardware_from_dict(full), "allreduce", 8, "net").compute_efficiency == \
        pytest.approx(middle(fitted, 8, "fp32"))
    for bad in ("fp16", "bf16", 16):
        with pytest.raises(ConfigError, match="models.net.precision"):
            hardware_from_dict(dict(spec, models={"net": {**spec["models"]["net"], "precision": bad}}))
    twin = {"net": {**spec["models"]["net"], "precision": "fp32"},
            "net-amp": {**spec["models"]["net"], "precision": "fp32", "full_precision": "net"}}
    with pytest.raises(ConfigError, match="models.net-amp.precision"):
        hardware_from_dict(dict(spec, models=twin))
    # a model whose input pipeline is not the file's names its own (a language model: none)
    own = {"net": spec["models"]["net"], "lm": {**spec["models"]["net"], "node_compute": "none"}}
    cal = hardware_from_dict(dict(spec, models=own))
    assert predict(cal, "allreduce", 8, "lm").compute_efficiency == 1
    assert predict(cal, "allreduce", 8, "net").compute_efficiency == on[40].compute_efficiency
    assert Calibration.from_dict(json.loads(json.dumps(cal.to_dict()))) == cal
    assert PRESETS["dgx-h100-ib400"].workloads["gpt2"].node_compute == NodeCompute()
    with pytest.raises(ConfigError, match="models.lm.node_compute='dali'"):
        hardware_from_dict(dict(spec, models={"lm": {**own["lm"], "node_compute": "dali"}}))
    for host, field in (({"cores": 0}, "host.cores"), ({"cores": 12.5}, "host.cores"),
                        ({"cores": True}, "host.cores"), ({"threads": 8}, "host"), (40, "host")):
        with pytest.raises(ConfigError, match=field):
            hardware_from_dict(dict(spec, host=host))
    # the input pipeline is the hardware file's to name: fitted is the DataLoader's term
    pipes = {name: predict(hardware_from_dict(dict(spec, node_compute=name)), "allreduce", 8, "net")
             for name in ("fitted", "pytorch", "dali-cpu", "none")}
    assert pipes["fitted"].compute_efficiency == pipes["pytorch"].compute_efficiency
    # DALI's table leaves its node all but nothing (a few millionths of a step) once the
    # framework's work and the wait for the slowest device are counted
    # (test_the_dgx1_fits_give_their_tables_back_and_checks_err_...)
    assert pipes["pytorch"].compute_efficiency < pipes["dali-cpu"].compute_efficiency
    assert pipes["dali-cpu"].compute_efficiency == pytest.approx(1, abs=1e-5)
    assert pipes["none"].compute_efficiency == 1
    with pytest.raises(ConfigError, match="node_compute.*dali.*pytorch, dali-cpu"):
        hardware_from_dict(dict(spec, node_compute="dali"))


def test_gradient_readiness_is_the_models_own_and_the_presets_carry_it():
    """When each tenth of the gradient is ready, from the layers backward visits in reverse: a
    hand-derived two-layer reference, and the presets' profiles are the function's on
    torchvision's models (VGG-16: 89% of its bytes, the FC layers, ready within 1% of backward)."""
    import torch
    import torchvision.models as tvm

    from downpour_lib.perf.terms import gradient_ready_at

    # big-but-cheap last (1000x1000, 1e6 MACs at batch 1), small-but-costly first (a conv:
    # 9e6 MACs, 280 parameters): 99.97% of the bytes are ready after 1e6 / 1.0e7 of backward
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 10, 3, padding=1), torch.nn.Flatten(),
                              torch.nn.Linear(10 * 10 * 10, 1000))
    ready = gradient_ready_at(net, torch.zeros(1, 3, 10, 10))
    macs = 10 * 10 * 10 * 3 * 9 + 1000 * 1000
    assert ready == (round((1000 * 1000 + 1000) / (macs + 1000), 3),) * 9 + (1.0,)
    hw = {name: PRESETS["horovod-pascal-25g"].workloads[name].ready_at
          for name in ("vgg16", "resnet101")}
    for name, ctor in (("vgg16", tvm.vgg16), ("resnet101", tvm.resnet101)):
        assert gradient_ready_at(ctor(), torch.zeros(1, 3, 224, 224)) == pytest.approx(hw[name])
    assert hw["vgg16"][7] < 0.01 and PRESETS["dgx-a100"].workloads["resnet50"].ready_at
    with pytest.raises(ConfigError, match="ready_at"):
        Workload("m", 32, 0.1, 1e6, ready_at=(0.5, 0.2, 1.0))


def test_attention_between_layers_is_backwards_before_the_earlier_layers_gradient():
    """Attention's scores and their product with the values have no parameters, yet backward
    runs them between two layers' gradients: hand-derived references, on the CPU (whose fused
    attention kernel torch does not count) and on the meta device. ``nn.MultiheadAttention``
    keeps its input projection beside its ``out_proj`` and never calls that as a module: both
    count where it starts (the old count died on its tuple output, as on an LSTM's). A layer of
    raw weights counts the products the flop counter finds in it."""
    import torch
    from torch import nn

    from downpour_lib.perf.terms import gradient_ready_at

    class Scores(nn.Module):  # 4 tokens of 8: Linear (256 MACs), scores and values (256), Linear
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x):
            h = self.a(x).unsqueeze(1)
            return self.b(nn.functional.scaled_dot_product_attention(h, h, h).squeeze(1))

    # backward: b (256 of 768 MACs) makes half the bytes; then the attention, then a
    for device in ("cpu", "meta"):
        net = Scores().to(device)
        assert gradient_ready_at(net, torch.zeros(1, 4, 8, device=device), points=2) == \
            (round(256 / 768, 3), 1.0), device

    class Heads(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)
            self.m = nn.MultiheadAttention(8, 1, batch_first=True)

        def forward(self, x):
            h = self.a(x)
            return self.b(self.m(h, h, h)[0])

    # rows: a (256 MACs, 72 parameters); the attention (its projections in, 768, scores and
    # values, 256, and out, 256: 1280) with 216 + 72 parameters; b (256, 72). Of 1792 and 432:
    # b's sixth at 256/1792, the attention's four sixths at 1536/1792, a's at the end
    ready = gradient_ready_at(Heads(), torch.zeros(1, 4, 8), points=6)
    assert ready == (round(256 / 1792, 3),) + (round(1536 / 1792, 3),) * 4 + (1.0,)

    class Raw(nn.Module):  # a layer of its own weights, no Linear: 4 x 8 x 8 = 256 MACs
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.zeros(8, 8))

        def forward(self, x):
            return x @ self.w

    # the Linear (256 MACs, 72 of 136 parameters) is ready at half of backward, not at 256/288
    assert gradient_ready_at(nn.Sequential(Raw(), nn.Linear(8, 8)), torch.zeros(4, 8),
                             points=2) == (0.5, 1.0)
    # an LSTM returns (output, state): read, not refused
    lstm = nn.LSTM(8, 16, batch_first=True)
    assert gradient_ready_at(lstm, torch.zeros(2, 5, 8))[-1] == 1.0


def test_gpt2s_readiness_is_what_an_h200_measured():
    """GPT-2 small's gradient readiness, counted on the meta device, against the one measured on
    an H200 in fp32 (results/reference/gpu/ready_at.json: when each tenth of the bytes had its
    gradient hook fire, batch 16 of 1024 tokens): within 0.01 of backward at every tenth. Left
    without attention's scores (13 % of its multiply-adds) the count was 0.034 off."""
    import torch

    from downpour_lib.models import build_model
    from downpour_lib.perf.terms import gradient_ready_at

    measured = next(r for r in json.loads((ROOT / "results" / "reference" / "gpu" /
                                           "ready_at.json").read_text())
                    if r["model"] == "gpt2" and r["precision"] == "fp32")
    with torch.device("meta"):
        net = build_model("gpt2", (1024,), 50257)
        ready = gradient_ready_at(net, torch.randint(0, 50257, (2, 1024)))
    assert ready == pytest.approx(measured["measured_ready_at"], abs=0.01)


def test_readiness_moves_buckets_and_tensor_fusion_sends_what_is_ready():
    """Evenly spread readiness is the old pipeline exactly; front-loaded gradients start the
    link earlier; Tensor Fusion (``bucketing: ready``) against hand-derived references on a
    link without latency: one that keeps up leaves only a sliver of the last layers exposed, one
    that cannot is busy from the start of backward to the end of its bytes."""
    from downpour_lib.perf.perfmodel import bucketed_allreduce_s

    even = tuple(k / 10 for k in range(1, 11))
    base = toy(overlap=1.0, compute_s=0.15)  # backward 0.1 s, the link busy 0.19 s
    w = base.workloads["m"]
    for ready, same in ((even, True), ((0.01,) * 9 + (1.0,), False)):
        cal = replace(base, workloads={"m": replace(w, ready_at=ready)})
        exposed = bucketed_allreduce_s(16, cal.workloads["m"], cal)[1]
        old = bucketed_allreduce_s(16, w, base)[1]
        assert exposed == pytest.approx(old) if same else exposed < old
    net = Network(Link(0.0, 1e9), Link(0.0, 1e9), 1)
    for rate, compute in ((1e9, 3.0), (1e9, 0.03)):
        m = replace(w, ready_at=even, compute_s=compute, backward_fraction=1.0)
        cal = Calibration("fused", replace(net, inter=Link(0.0, rate)), {"m": m},
                          bucket_bytes=25e6, bucketing="ready")
        total, exposed = bucketed_allreduce_s(8, m, cal)
        wire = float(ring_share("allreduce", 8)) * 100e6 / rate  # 0.175 s for all of it
        assert total == pytest.approx(wire)
        if compute > wire:  # keeps up: the last message is a sliver of the bytes
            assert exposed <= 2e-3 * wire
        else:  # cannot: busy from the first gradient to the last byte
            assert exposed == pytest.approx(wire - compute, rel=0.02)
    with pytest.raises(ConfigError, match="bucketing"):
        replace(base, bucketing="greedy")


def test_past_the_cores_every_rank_shares_them_and_within_them_nothing_changes():
    """Issue 34: the crowding term (a node's cores time-shared by its ranks, each hop a wake-up)
    is nothing where the ranks fit the cores, so GPU nodes (a rank per GPU) predict as before."""
    free = Network(Link(1e-5, 5e9), Link(1e-4, 1e9), per_node=32, gamma_s_per_byte=1e-10)
    crowded = replace(free, cores=4, wake_s=2e-4)
    for n in (1, 2, 4):
        assert crowded.shared(n) == free.shared(n) == free.intra
        assert allreduce_s(n, 6.6e6, crowded) == allreduce_s(n, 6.6e6, free)
        assert crowded.time_shared_s(0.01, n) == 0.01
    # at 32 ranks on 4 cores each rank has a core an eighth of the time, and waits a wake-up a hop
    assert crowded.shared(32) == Link((1e-5 + 2e-4) * 8, 5e9 / 8)
    assert crowded.time_shared_s(0.01, 32) == pytest.approx(0.08)
    with pytest.raises(ConfigError, match="wake_s"):
        replace(free, wake_s=-1.0)


def test_wake_up_fitted_at_few_ranks_predicts_32_ranks_on_2_cores():
    """The committed allreduce rows of this machine (mpi backend, 2 cores, 2 to 32 ranks): the link
    fitted at 2 ranks and the wake-up at 4 and 8 predict the model's allreduce at 32 ranks, which
    the uncrowded link misses by a factor of 29."""
    rows = json.loads((ROOT / "results" / "reference" / "scaling" / "emulated_local"
                       / "collectives.json").read_text())
    link = calib.fit_link([r for r in rows if r["world_size"] == 2], "mpi")
    net = Network(link, link, per_node=32, cores=2)
    wake = calib.fit_wake(rows, "mpi", net, most_ranks=8)
    assert wake > 0
    crowded = replace(net, wake_s=wake)
    (measured,) = [r["p50_s"] for r in rows if r["backend"] == "mpi" and r["world_size"] == 32
                   and r["bytes"] == 6597688]
    assert allreduce_s(32, 6597688, crowded) == pytest.approx(measured, rel=0.2)
    alone = replace(net, cores=None)  # each rank with a core of its own: what it said before
    assert allreduce_s(32, 6597688, alone) < measured / 20
    assert calib.fit_wake(rows, "mpi", alone) == 0.0  # no cores known: no term


SCALING = ROOT / "results" / "reference" / "scaling"


def two_core_network() -> Network:
    """This machine's (2 cores) link fitted on its committed 2-rank mpi collectives, and the
    wake-up on its 4- and 8-rank rows."""
    rows = json.loads((SCALING / "emulated_local" / "collectives.json").read_text())
    link = calib.fit_link([r for r in rows if r["world_size"] == 2], "mpi")
    net = Network(link, link, per_node=2, cores=2)
    return replace(net, wake_s=calib.fit_wake(rows, "mpi", replace(net, per_node=64), most_ranks=8))


def emulated_against_model(here: Path, net: Network) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The emulated runs in ``here`` against the model on ``net``, and on ``net`` without the
    crowded term (each rank a core of its own), each indexed by (algorithm, workers)."""
    from downpour_lib.study.emulated_check import emulated_vs_model

    ref = calib.load(SCALING / "calibration.json")
    runs = pd.read_csv(here / "runs.csv")
    return tuple(emulated_vs_model(runs, replace(ref, network=n, overlap=0.0)).set_index(
        ["algorithm", "workers"]) for n in (net, replace(net, cores=None, wake_s=0.0)))


def test_the_crowded_model_beside_the_committed_emulated_runs_at_32_workers():
    """The committed emulated runs (50 ms a step, 2 cores, a quiet machine): with the cores and the
    wake-up fitted at 4 and 8 ranks, every algorithm's 32-worker step is predicted closer than
    without (which misses all by 36-84%), sync_ps within 15%, all five within 30%; the README's
    table states the rest and why."""
    crowded, alone = emulated_against_model(SCALING / "emulated_local", two_core_network())
    at32 = crowded.xs(32, level="workers")
    assert set(at32.index) >= {"allreduce", "ddp", "sync_ps", "sgp"}
    for algorithm, row in at32.iterrows():
        assert abs(row.error) < abs(alone.loc[(algorithm, 32), "error"])
        assert alone.loc[(algorithm, 32), "error"] < -0.3
    assert abs(at32.loc["sync_ps", "error"]) <= 0.15
    assert set(at32.index) >= {"localsgd"} and (at32.error.abs() <= 0.3).all(), at32.error
    assert (crowded.xs(1, level="workers").error.abs() <= 0.05).all()  # its own 1-worker step


def test_the_scaling_figures_draw_the_models_curve_beside_each_emulated_series(tmp_path):
    """make study's committed 32-worker study (its runs and the calibration it wrote): throughput,
    speedup and efficiency each draw one dotted curve per emulated series, the model's prediction
    for that series' compute and links (N x batch / the predicted step, in samples/s); a study
    with no calibration beside it draws none, and its figures are still written."""
    import shutil

    from downpour_lib.study import scaling_plots as plots
    from downpour_lib.study.emulated_check import emulated_vs_model

    here = tmp_path / "study"
    shutil.copytree(SCALING / "make_study_32", here, ignore=shutil.ignore_patterns("figures"))
    runs = plots.load_runs(here / "runs.csv")
    checked = emulated_vs_model(runs, calib.load(here / "calibration.json"))
    predicted = checked.set_index(["series", "workers"]).predicted_step_s
    emulated = sorted(checked.series.unique())
    assert len(emulated) == 2 and all("(emulated" in name for name in emulated)

    def dotted(fig) -> list:
        return [line for line in fig.axes[0].lines
                if line.get_linestyle() == ":" and len(line.get_xdata())]

    curves = dotted(plots.throughput_figure(runs, checked))
    assert len(curves) == len(emulated)
    for name, line in zip(emulated, curves, strict=True):  # drawn series by series, by name
        batch = int(runs[runs.compute == "emulated"].batch_size.iloc[0])
        assert list(line.get_xdata()) == [1, 2, 4, 8, 16, 32]
        want = [n * batch / predicted[(name, n)] for n in line.get_xdata()]
        assert line.get_ydata() == pytest.approx(want, rel=1e-3), name
    for name, line in zip(emulated, dotted(plots.efficiency_figure(runs, checked)), strict=True):
        want = [predicted[(name, 1)] / predicted[(name, n)] for n in line.get_xdata()]
        assert line.get_ydata() == pytest.approx(want, rel=1e-3), name
    assert len(dotted(plots.speedup_figure(runs, checked))) == len(emulated)
    assert not dotted(plots.throughput_figure(runs))

    saved = plots.make_figures(here)
    assert [p.name for p in saved] == [f"{name}.png" for name in plots.FIGURES]
    (here / "calibration.json").unlink()
    assert len(plots.make_figures(here, tmp_path / "bare")) == len(plots.FIGURES)


def test_the_crowded_model_on_a_16_core_machine_it_was_never_fitted_on():
    """Emulated runs measured on another machine (16 cores, an H200 node's host; gloo, 50 ms a step,
    1 to 32 workers), with its link fitted from its own 2-rank collectives and the wake-up fitted on
    the 2-core machine (nothing of the step fitted there): allreduce within 15% at every count, 32
    ranks on 16 cores included, which the model without the crowded term misses by a third; sync_ps
    within 16% to 4 workers, and pessimistic by half or more from 8."""
    here = SCALING / "emulated_16cores"
    rows = json.loads((here / "collectives.json").read_text())
    link = calib.fit_link([r for r in rows if r["world_size"] == 2], "gloo")
    net = Network(link, link, per_node=2, cores=16, wake_s=two_core_network().wake_s)
    assert set(pd.read_csv(here / "runs.csv").cores) == {16}
    crowded, alone = emulated_against_model(here, net)
    allreduce = crowded.loc["allreduce"]
    assert list(allreduce.index) == [1, 2, 4, 8, 16, 32]
    assert (allreduce.error.abs() <= 0.15).all(), allreduce.error
    assert alone.loc[("allreduce", 32), "error"] < -0.3
    sync_ps = crowded.loc["sync_ps"].error
    assert list(sync_ps.index) == [1, 2, 4, 8, 16, 32]
    assert (sync_ps.loc[:4].abs() <= 0.16).all(), sync_ps
    # The stated miss (README): push_pull charges one server's link with every worker's model, but
    # sync_ps reduces and broadcasts, which gloo combines on the way. Fixing the model fails this.
    assert (sync_ps.loc[8:] > 0.5).all(), sync_ps


def test_input_that_lied_is_named_in_one_line(tmp_path):
    """Issue 65, item 1: each input that was ignored, read wrongly or ended in a traceback now
    exits 2 with one line naming the field (or is honoured: the node's loss at the GPUs in use)."""
    from downpour_lib.perf.hardware import hardware_from_dict

    spec = {"name": "mine", "devices_per_node": 8, "host": {"cores": 40},
            "links": {"intra": {"gbit_per_s": 1200}, "inter": {"gbit_per_s": 100}},
            "models": {"net": {"batch": 256, "images_per_s": 1200, "parameters": 25e6}}}
    hardware_from_dict(spec)
    typo = dict(spec, links={"intra": {"gbit_per_s": 1200}, "intre": {"gbit_per_s": 100}})
    with pytest.raises(ConfigError, match="links='intre'.*did you mean inter"):
        hardware_from_dict(typo)
    # a rate or latency in another unit (bytes/s for Gbit/s, ns for us): past any link's
    for field, bad, says in (("gbit_per_s", 12.5e9, "a line rate in Gbit/s, at most 100,000"),
                             ("latency_us", 14e6, "microseconds, from 0 to 1,000,000")):
        inter = {"gbit_per_s": 100, field: bad}
        with pytest.raises(ConfigError, match=f"links.inter.{field}=.* is not valid: {says}"):
            hardware_from_dict(dict(spec, links={"intra": {"gbit_per_s": 1200}, "inter": inter}))
    model = spec["models"]["net"]
    # a worker of several devices on a node of several workers: the network would count 8
    # workers a node where 2 (or 1) are; a worker of a whole node is devices_per_node: 1
    for field, bad in (("backward_fraction", "half"), ("backward_fraction", 1.5),
                       ("devices_per_worker", 16), ("devices_per_worker", 8),
                       ("devices_per_worker", 4)):
        with pytest.raises(ConfigError, match=f"models.net.{field}"):
            hardware_from_dict(dict(spec, models={"net": {**model, field: bad}}))
    for bad in ("high", True, -0.1):
        with pytest.raises(ConfigError, match="jitter"):
            hardware_from_dict(dict(spec, jitter=bad))
    cal = hardware_from_dict(spec)
    with pytest.raises(ConfigError, match="slowdown.*slow_workers"):
        predict(cal, "allreduce", 16, "net", {"slowdown": 2.0})
    with pytest.raises(ConfigError, match="slowdown.*slow_workers"):
        predict(cal, "downpour", 4, "net", {"slowdown": 2.0})
    # 4 workers of an 8-GPU node: the loss of the 4 GPUs in use, not of all 8 (shares measured
    # on the node: a point; each share named when missing, unknown or not a share)
    for bad, field in (({"amp": 0.1}, "node_compute={'amp': 0.1}"), ({"fp32": 0, "amp": "x"},
                       "node_compute.amp='x'"), ({"fp32": -0.1, "amp": 0}, "node_compute.fp32"),
                       ({"fp32": 0, "amp": 0, "bf16": 0}, "node_compute='bf16'.*amp, fp32")):
        with pytest.raises(ConfigError, match=field):
            hardware_from_dict(dict(spec, node_compute=bad))
    mixed = hardware_from_dict(dict(spec, node_compute={"fp32": 0.01, "amp": 0.12},
                                    models={"net": {**model, "precision": "amp"}}))
    assert mixed.node_compute.measured and mixed.node_compute.amp == 0.12
    four, eight = predict(mixed, "allreduce", 4, "net"), predict(mixed, "allreduce", 8, "net")
    node = mixed.node_compute
    assert four.compute_efficiency == pytest.approx(node.efficiency(4, "amp"))
    assert four.compute_efficiency > eight.compute_efficiency == pytest.approx(node.efficiency(8, "amp"))
    # through the command: one line on stderr, exit 2
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\nlinks:\n  intra: {gbit_per_s: 10\n  inter: [\n")
    runs = {"yaml": ("--hardware", str(path), "--model", "resnet50"),
            "alone": ("--preset", "sgp-v100-10g", "--model", "resnet50", "--link-efficiency", "0.5"),
            "range": ("--preset", "sgp-v100-10g", "--model", "resnet50", "--inter-gbit", "10",
                      "--link-efficiency", "2"),
            "node": ("--preset", "sgp-v100-10g", "--model", "resnet50", "--node-compute", "0.01,-1")}
    for name, args in runs.items():
        proc = downpour("model", "predict", *args)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, \
            (name, explain(proc))
        assert {"yaml": f"{path}:4:8", "alone": "link_efficiency=0.5", "range": "link_efficiency=2.0",
                "node": "node_compute.amp=-1.0"}[name] in lines[0], (name, lines)
    ok = downpour("model", "predict", "--preset", "sgp-v100-10g", "--model", "resnet50",
                  "--inter-gbit", "10", "--link-efficiency", "0.5")
    assert ok.returncode == 0, explain(ok)
    unit = downpour("model", "predict", "--preset", "sgp-v100-10g", "--model", "resnet50",
                    "--inter-gbit", "100Gbit")  # argparse's "invalid float value" named no unit
    assert unit.returncode == 2 and "argument --inter-gbit: '100Gbit': give a number in Gbit/s, " \
        "without the unit, e.g. 100" in unit.stderr, explain(unit)


def test_model_nccl_prints_the_tuners_table_and_what_it_runs(tmp_path):
    """`downpour model nccl`: NCCL's Latency/AlgBw table (as NCCL_DEBUG_SUBSYS=TUNING prints its
    own at init) and its choice per size, as `auto` prices them on a preset's links. On one DGX
    A100 (8 ranks, NVLink at 288 GB/s achieved, 3.4 us a hop) a Simple ring's latency is its base
    8.4 us and 14 hops, its bandwidth the link's over the ring's 2(7)/8 of the buffer."""
    from downpour_lib.perf.netmodel import nccl_choices

    out = tmp_path / "nccl.csv"
    proc = downpour("model", "nccl", "--preset", "dgx-a100", "--workers", "8,256",
                    "--sizes", "8,25M,1G", "--csv", str(out))
    assert proc.returncode == 0, explain(proc)
    assert "tuning.cc" in proc.stdout and "NCCL_DEBUG_SUBSYS=TUNING" in proc.stdout
    net = PRESETS["dgx-a100"].network
    assert net.intra.bandwidth_Bps == pytest.approx(288e9) and net.intra.alpha_s == pytest.approx(3.4e-6)
    eight = next(line.split() for line in proc.stdout.splitlines() if line.split()[:1] == ["8"])
    assert eight[3] == f"{8.4 + 14 * 3.4:.1f}/{288 / 1.75:.1f}" and eight[4:] == ["-"] * 3, eight
    rows = pd.read_csv(out)
    assert list(rows.workers) == [8] * 3 + [256] * 3 and list(rows.bytes[:3]) == [8, 25 << 20, 1 << 30]
    for row in rows.itertuples():
        times = nccl_choices(row.workers, row.bytes, net)
        assert (row.algorithm, row.protocol) == min(times, key=times.get)
        assert row.time_us == pytest.approx(1e6 * min(times.values()))
    # small messages go by LL, large by Simple; across nodes the tree takes them first
    assert list(rows.protocol) == ["LL", "LL128", "Simple", "LL", "LL128", "Simple"]
    assert list(rows.algorithm[3:]) == ["tree"] * 3


def test_new_terms_against_hand_computed_references():
    """Issue 65, item 2: halving-doubling, NCCL's rule on one node, gradient accumulation and the
    transports' ranges, each against its value worked by hand."""
    from downpour_lib.perf.netmodel import halving_doubling_allreduce_s
    from downpour_lib.perf.terms import transport_rate

    # 8 ranks: 2 log2(8) alpha + 2 (7/8) M / beta; 6 ranks: 4 as that, plus fold and unfold
    assert halving_doubling_allreduce_s(8, 1e6, LINK) == pytest.approx(6e-5 + 1.75e-3)
    assert halving_doubling_allreduce_s(6, 1e6, LINK) == pytest.approx(4e-5 + 1.5e-3 + 2.02e-3)
    one_node = Network(Link(1e-5, 1e9), LINK, per_node=8)
    assert allreduce_s(8, 1e3, one_node, "tree") < allreduce_s(8, 1e3, one_node, "ring")
    # NCCL on one node runs a ring (its tree is a chain there), under its fastest protocol: LL's
    # base latency and 14 hops of 0.6/3.4 the link's, its bytes at a quarter of the rate
    assert allreduce_s(8, 1e3, one_node, "auto") == pytest.approx(
        6.6e-6 + 14 * 1e-5 * 0.6 / 3.4 + 1.75 * 1e3 / (1e9 / 4))
    # two nodes of 8 (NCCL's tuning.cc): a ring hop of LL128 costs 1.9/3.4 of the intra-node
    # latency inside a node and 4/14 of the card's across; a tree's Simple hop 28/3.4 of it in the
    # node's chain and 28/14 across, its bytes at 0.92 of the rate and by size (1e6 bytes: 0.5)
    from downpour_lib.perf.netmodel import nccl_choices

    two = Network(Link(1e-6, 100e9), Link(1e-5, 10e9), per_node=8)
    times = nccl_choices(16, 1e6, two)
    hop = (2 * 1e-5 * 4 / 14 + 14 * 1e-6 * 1.9 / 3.4) / 16
    assert times["ring", "LL128"] == pytest.approx(14e-6 + 30 * hop + 30 / 16 * 1e6 / (10e9 * 0.92))
    assert times["tree", "Simple"] == pytest.approx(
        2 * (7 * 1e-6 * 28 / 3.4 + 1 * 1e-5 * 2) + 2 * 1e6 / (10e9 * 0.92 * 0.5))
    # accumulation 4, no overlap: four passes of 0.1 s, then four 25 MB buckets' ring allreduces
    cal = toy(overlap=0.0)
    acc = replace(cal, workloads={"m": replace(cal.workloads["m"], accumulation=4)})
    p = predict(acc, "allreduce", 8, "m")
    assert p.step_s == pytest.approx(0.4 + 4 * ring_allreduce_s(8, 25e6, LINK))
    assert p.efficiency == pytest.approx(0.4 / p.step_s)
    assert p.samples_per_s == pytest.approx(8 * 32 * 4 / p.step_s)
    assert p.efficiency > predict(cal, "allreduce", 8, "m").efficiency
    with pytest.raises(ConfigError, match="accumulation"):
        Workload("m", 32, 0.1, 1e6, accumulation=0)
    assert transport_rate("rdma", 100) == (0.90, 0.976)  # NCCL maintainers and users, cited in terms
    assert transport_rate("tcp", 10) == (0.95, 0.98)  # below what its sockets move: the wire's
    assert transport_rate("tcp", 25) == pytest.approx((13.6 / 25, 0.98))  # nccl-tests#83's 13.6
    assert transport_rate("tcp", 100) == pytest.approx((0.136, 0.48))  # nccl#450's best: 48
    # several ranks a node: no more than nccl#209's 22.9 of 32 Gbit/s, no less than 13.6 Gbit/s
    assert transport_rate("tcp", 25, per_node=4) == pytest.approx((13.6 / 25, 22.9 / 32))
    assert transport_rate("tcp", 100, per_node=8) == pytest.approx((0.136, 0.48))
    assert transport_rate("tcp", 10, per_node=8) == (0.95, 0.98)  # 13.6 Gbit/s: the wire's
    assert transport_rate("rdma", 25, per_node=4) == (0.90, 0.976)


def test_the_band_is_what_was_not_measured_and_the_point_its_middle():
    """Issue 65, item 3: a file that measures everything predicts a point; one that leaves the
    overlap, the cross-node rate, the jitter, the devices' and the nodes' spread and the framework's
    work open predicts a band, its point the middle, and each range given as a measured value narrows it."""
    from downpour_lib.perf.hardware import hardware_from_dict, with_fields
    from downpour_lib.perf.terms import MEASUREMENT_SPREAD

    spec = {"devices_per_node": 4, "overlap": 0.8, "jitter": 0.0, "framework": 2.0,
            "device_spread": 0.01, "node_spread": 0.02, "node_compute": {"fp32": 0.01, "amp": 0.1},
            "links": {"intra": {"gbit_per_s": 96}, "inter": {"gbit_per_s": 25, "efficiency": 0.9}},
            "models": {"vgg16": {"batch": 64, "images_per_s": 154, "parameters": 138357544}}}
    point = predict(hardware_from_dict(spec), "allreduce", 64, "vgg16")
    assert point.efficiency_low == point.efficiency == point.efficiency_high
    open_spec = {k: v for k, v in spec.items()
                 if k not in ("overlap", "jitter", "framework", "device_spread", "node_spread",
                              "node_compute")}
    open_spec["links"] = {"intra": {"gbit_per_s": 96},
                          "inter": {"gbit_per_s": 25, "transport": "rdma"}}
    cal = hardware_from_dict(dict(open_spec, overlap=None))
    band = predict(cal, "allreduce", 64, "vgg16")
    # the middle of the band, each end without the two runs' spread it is moved out by
    assert band.efficiency == pytest.approx((band.efficiency_low / (1 - MEASUREMENT_SPREAD)
                                             + band.efficiency_high / (1 + MEASUREMENT_SPREAD)) / 2)
    assert band.efficiency_low < band.efficiency < band.efficiency_high
    narrower = predict(with_fields(cal, jitter=0.0, overlap=0.8), "allreduce", 64, "vgg16")
    assert (narrower.efficiency_high - narrower.efficiency_low
            < band.efficiency_high - band.efficiency_low)
    fixed = predict(with_fields(cal, jitter=0.0, overlap=0.8, framework=2.0), "allreduce", 64, "vgg16")
    assert (fixed.efficiency_high - fixed.efficiency_low
            < narrower.efficiency_high - narrower.efficiency_low)
    # the DataLoader's node term is a range (two containers): measured, it is a point
    assert not cal.node_compute.measured and cal.node_compute.fp32 < cal.node_compute.fp32_high
    node = predict(with_fields(cal, jitter=0.0, overlap=0.8, framework=2.0,
                               node_compute={"fp32": 0.01, "amp": 0.1}), "allreduce", 64, "vgg16")
    assert node.efficiency_high - node.efficiency_low < fixed.efficiency_high - fixed.efficiency_low
    spread = predict(with_fields(cal, jitter=0.0, overlap=0.8, framework=2.0, device_spread=0.01,
                                 node_compute={"fp32": 0.01, "amp": 0.1}), "allreduce", 64, "vgg16")
    assert spread.efficiency_high - spread.efficiency_low < node.efficiency_high - node.efficiency_low
    nodes = predict(with_fields(cal, jitter=0.0, overlap=0.8, framework=2.0, device_spread=0.01,
                                node_spread=0.02, node_compute={"fp32": 0.01, "amp": 0.1}),
                    "allreduce", 64, "vgg16")
    assert nodes.efficiency_high - nodes.efficiency_low \
        < spread.efficiency_high - spread.efficiency_low


def test_model_check_prints_the_goal_numbers():
    """Issue 65, item 4, on the package's own table (presets.published_checks): the point's mean
    absolute error at most 5 points, errors on both sides, bands no wider than 20 points; the
    command prints those numbers, and five of six inside the band (105 of 126, with the
    optimizer's update once a step: ``terms.OPTIMIZER_BYTES``; 101 without it). Where it falls
    short of the goal: one error beyond 10 points: NVIDIA's PyTorch BERT at sequence
    512 in TF32 at 32 nodes, whose TF32 rows at 512 lose far more across nodes than its
    mixed-precision rows that send half the bytes (nothing in the model loses that). The widest
    band, VGG-16's at 128 GPUs (its overlap, cross-node rate and nodes' spread all ranges), is 19
    points: a slow worker's longer backward hides more of its allreduce. PaddlePaddle's BERT across
    nodes loses more than every point, by under 7 points
    (test_bert_in_paddlepaddle_loses_a_share_of_each_pass_across_nodes), TensorFlow's at 32 nodes
    by up to 10 (test_bert_in_tensorflow_loses_more_each_pass_as_the_ranks_grow). Transformer-XL's
    16 GPUs of a DGX-2H come within 6 points
    (test_transformer_xl_counts_the_framework_in_parameters_worth_of_its_compute) and lie outside
    their bands by under 2. On the image models, what falls outside is one node's 8 GPUs, within 2
    points of its band: ResNeXt's and SE-ResNeXt's. On BERT every other row on DGX A100s is within
    1.5 points of its band; on one DGX-1 the model gives 8 GPUs up to 2.5 points more than they
    keep."""
    from downpour_lib.perf.presets import check_summary

    checks = [c for c in published_checks() if c.unit == "efficiency"]
    s = check_summary()
    assert s["mae"] <= 5 and s["below"] and s["above"], s
    assert s["band_max"] <= 20, s  # points
    assert s["checks"] == 126 and s["inside"] >= 105, s
    beyond = [c.claim for c in checks if abs(c.error) > 0.10]
    assert beyond == ["BERT-large, sequence 512, TF32: 32 DGX A100 nodes (256 GPUs), 8 passes a "
                      "step, efficiency against 1 node"], beyond
    outside = [c for c in checks if c.outside_band > 0 and "BERT" not in c.claim
               and "Transformer-XL" not in c.claim]
    assert all("8 GPUs" in c.claim and c.outside_band < 0.02 for c in outside), outside
    assert all("ResNeXt" in c.claim for c in outside), outside
    bert = [c for c in checks if "BERT" in c.claim and "sequence 512, TF32" not in c.claim
            and "DGX-1" not in c.claim and "TensorFlow" not in c.claim
            and "PaddlePaddle" not in c.claim]
    assert len(bert) == 18 and all(c.outside_band < 0.015 for c in bert), bert
    dgx1 = [c for c in checks if "BERT" in c.claim and "DGX-1" in c.claim]  # one node: optimistic
    assert len(dgx1) == 4 and all(0 < c.error < 0.025 for c in dgx1), dgx1
    tf32 = [c.error for c in checks if "sequence 512, TF32:" in c.claim and "nodes" in c.claim]
    assert all(b > a - 0.001 for a, b in zip(tf32, tf32[1:], strict=False)) and tf32[-1] > 0.15, tf32  # grows
    assert all(c.outside_band == 0 for c in checks if "512 GPUs" in c.claim)
    proc = downpour("model", "check")
    assert proc.returncode == 0 and "mean absolute error" in proc.stdout, explain(proc)
    assert f"inside the band: {s['inside']} of {s['checks']}" in proc.stdout
    # each kind of check apart (presets.KINDS), every efficiency check in one: where the band holds
    # (images, and one node's devices: 61 of 68 inside) and where it holds least (language models
    # across nodes, whose bands are narrow: one bucket, no overlap; more often above the value)
    from downpour_lib.perf.presets import KINDS, check_groups

    groups = check_groups()
    assert list(groups) == list(KINDS) and sum(g["checks"] for g in groups.values()) == s["checks"]
    for kind, g in groups.items():
        assert f"  {kind}: {g['checks']}; point: mean absolute error {g['mae']:.1f}" in proc.stdout
    elsewhere = [g for kind, g in groups.items() if kind != "language models, across nodes"]
    assert sum(g["inside"] for g in elsewhere) >= 61 and sum(g["checks"] for g in elsewhere) == 68
    lm = groups["language models, across nodes"]
    assert lm["inside"] >= 44 and lm["checks"] == 58 and lm["above"] > 1.5 * lm["below"], lm


def test_model_check_draws_each_check_beside_its_band(tmp_path):
    """`downpour model check --figure` (and notebook 06) draw the table: a panel per kind of
    check, titled with how many published values lie inside their bands; one marker per check at
    (published, point), filled inside its band and hollow outside, its band a bar from low to
    high. A figure it cannot write names the flag."""
    import numpy as np

    from downpour_lib.perf.presets import check_groups, published_table
    from downpour_lib.study.model_plots import published_figure

    checks = published_checks()
    groups = check_groups(checks)
    table = published_table(checks)
    fig = published_figure(table)
    assert [ax.get_title() for ax in fig.axes] == [
        f"{kind}: {g['inside']} of {g['checks']} inside" for kind, g in groups.items()]
    for ax, (kind, g) in zip(fig.axes, groups.items(), strict=True):
        rows = table[table.kind == kind]
        drawn = {c.get_label(): c for c in ax.containers}
        assert set(drawn) <= {"inside its band", "outside its band"}
        counts = {label: len(c.lines[0].get_xdata()) for label, c in drawn.items()}
        assert counts.get("inside its band", 0) == g["inside"], (kind, counts)
        assert counts.get("outside its band", 0) == g["checks"] - g["inside"], (kind, counts)
        bands = sorted((round(seg[:, 1].min(), 9), round(seg[:, 1].max(), 9))
                       for c in drawn.values() for seg in map(np.asarray, c.lines[2][0].get_segments()))
        assert bands == sorted(zip(rows.low.round(9), rows.high.round(9), strict=True)), kind
    proc = downpour("model", "check", "--figure", str(tmp_path / "checks.png"))
    assert proc.returncode == 0, explain(proc)
    assert (tmp_path / "checks.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {tmp_path / 'checks.png'}" in proc.stdout


def test_your_own_results_are_checked_as_the_packages_are(tmp_path):
    """`downpour model check --checks FILE.csv` (perf.checks_file): a reviewer's or a
    user's own results, a row each naming a preset or a hardware file beside the CSV, checked as
    the package's table is. Rows that restate the package's checks (one worker against 512; 32
    nodes against one at their accumulations; a preset copied to a file of one's own) get their
    point and band exactly; bad input names the row, the field and what would work."""
    import shutil

    from downpour_lib.perf.checks_file import checks_from_file
    from downpour_lib.perf.hardware import HARDWARE_DIR
    from downpour_lib.perf.presets import check_summary

    shutil.copy(HARDWARE_DIR / "horovod-pascal-25g.yaml", tmp_path / "ours.yaml")
    theirs = {c.claim: c for c in published_checks()}
    same = {  # our row's claim: the package's check it restates
        "a": "Horovod ResNet-101 scaling efficiency at 512 GPUs",
        "b": "BERT-large, sequence 128, mixed precision: 32 DGX A100 nodes (256 GPUs), 1 passes a "
             "step, efficiency against 1 node",
        "c": "Horovod VGG-16 scaling efficiency at 128 GPUs"}
    (tmp_path / "mine.csv").write_text(
        "claim,hardware,model,workers,against,accumulation,against_accumulation,published,source\n"
        "a,horovod-pascal-25g,resnet101,512,,,,0.90,a README\n"
        "b,dgx-a100-bert,bert-large-128-amp,256,8,1,32,0.949,\n"
        "c,ours.yaml,vgg16,128,,,,0.79,\n")
    mine = checks_from_file(tmp_path / "mine.csv")
    assert [c.claim for c in mine] == ["a", "b", "c"] and mine[0].source == "a README"
    for c in mine:
        ref = theirs[same[c.claim]]
        assert (c.predicted, c.low, c.high, c.kind) == (ref.predicted, ref.low, ref.high, ref.kind)
    assert check_summary(mine)["inside"] == 3
    proc = downpour("model", "check", "--checks", str(tmp_path / "mine.csv"))
    assert proc.returncode == 0, explain(proc)
    assert "efficiency checks: 3;" in proc.stdout and "inside the band: 3 of 3" in proc.stdout

    header = "claim,hardware,model,workers,against,published\n"
    for row, match in (
            ("x,horovod-pascal-25g,resnet101,512,,90", "checks row 1 published='90'.*0.9 for 90 %"),
            ("x,dgx-a100-nope,resnet101,512,,0.9", "checks row 1 hardware='dgx-a100-nope'.*a preset"),
            ("x,horovod-pascal-25g,bert-large-128,512,,0.9",
             "checks row 1 model='bert-large-128'.*horovod-pascal-25g has compute for inception_v3"),
            ("x,horovod-pascal-25g,resnet101,0,,0.9", "checks row 1 workers='0'.*whole number >= 1"),
            ("x,horovod-pascal-25g,resnet101,8,16,0.9", "checks row 1 against=16.*at most the row's"),
            ("x,missing.yaml,resnet101,8,,0.9", "hardware=.*missing.yaml.*no such file")):
        (tmp_path / "bad.csv").write_text(header + row + "\n")
        with pytest.raises(ConfigError, match=match):
            checks_from_file(tmp_path / "bad.csv")
    (tmp_path / "bad.csv").write_text("claim,hardware,model,published,speed\nx,a,b,0.9,1\n")
    with pytest.raises(ConfigError, match="lacks workers: give a row a check with claim"):
        checks_from_file(tmp_path / "bad.csv")
    with pytest.raises(ConfigError, match="checks=.*no such file"):
        checks_from_file(tmp_path / "none.csv")
    proc = downpour("model", "check", "--checks", str(tmp_path / "bad.csv"))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, explain(proc)
    assert "checks=" in proc.stderr and "lacks workers" in proc.stderr


def test_bert_across_nodes_scales_as_the_model_says_but_at_512_in_tf32():
    """NVIDIA's BERT-large pre-training on DGX A100 nodes (presets.BERT_NODES): gradient
    accumulation and one bucket after the last pass. What docs/perf_model.md says of its rows:
    the README measures one node's 8 GPUs twice, under 1 % apart, and 2 nodes faster than twice
    one; one node's 8 GPUs (a DGX A100's, a DGX-1's), charged no input pipeline, lose what the
    wait for the slowest of 8 devices gives (terms.DEVICE_SPREAD_RANGE), each within half a point
    of its band and most of them less than its point; sequence 512 in TF32 loses at 32 nodes over three times
    what its mixed precision (half the bytes) and sequence 128 in TF32 (the same bytes, less
    compute a step) lose, and in seconds a step its loss is a fixed cost from 2 nodes to 32."""
    from downpour_lib.perf.presets import BERT_NODES, BERT_ONE_NODE

    for model, _, eight in BERT_ONE_NODE[0][-1]:  # the DGX A100's
        again = BERT_NODES[model][0][2]
        assert eight != again and abs(eight / again - 1) < 0.01, model
    assert BERT_NODES["bert-large-128-amp"][1][2] > 2 * BERT_NODES["bert-large-128-amp"][0][2]
    checks = {c.claim: c for c in published_checks() if "BERT" in c.claim
              and "TensorFlow" not in c.claim and "PaddlePaddle" not in c.claim}
    one_node = [c for claim, c in checks.items() if "8 GPUs of a DGX" in claim]  # A100 and DGX-1
    assert len(one_node) == 8 and all(c.outside_band < 0.005 for c in one_node), one_node
    assert sum(c.error > 0 for c in one_node) >= 6, one_node

    def lost(model):  # at 32 nodes, against 1
        return lost_share(BERT_NODES[model])[-1]

    assert lost("bert-large-512") > 3 * max(lost("bert-large-512-amp"), lost("bert-large-128"))
    # in seconds a step (a GPU's batch times its passes), what 2 to 32 nodes lose against one is a
    # fixed cost: 0.23-0.36 s for sequence 512 in TF32, under 0.1 s for the other three settings
    seconds = {model: [passes * s for (_, passes, _), s in zip(rows[1:], lost_a_pass_s(
        "dgx-a100-bert", model, rows), strict=True)] for model, rows in BERT_NODES.items()}
    assert all(0.2 < s < 0.4 for s in seconds.pop("bert-large-512")), seconds
    assert all(s < 0.1 for lost_s in seconds.values() for s in lost_s), seconds
    # the model, whose bytes and framework's work (per byte of gradient) halve at 2 bytes, and
    # whose optimizer's update costs mixed precision's shorter passes more, gives sequence 512
    # at 32 nodes within a point in both precisions, under a third of what TF32 loses
    at_32 = {c.claim.split(":")[0]: c.predicted for claim, c in checks.items() if "32 DGX" in claim}
    assert abs(at_32["BERT-large, sequence 512, TF32"]
               - at_32["BERT-large, sequence 512, mixed precision"]) < 0.01, at_32
    assert 1 - at_32["BERT-large, sequence 512, TF32"] < lost("bert-large-512") / 3
    # the other three settings keep more than the point across nodes, by under 3.5 points, each
    # inside its band (the optimizer's update at its middle: PyTorch's fused LAMB runs nearer
    # its low end)
    others = [c for claim, c in checks.items() if "nodes" in claim and "512, TF32" not in claim]
    assert len(others) == 15 and all(c.outside_band == 0 or c.published > 1 for c in others)
    assert all(-0.035 < c.error < 0 for c in others), others


def test_the_readmes_time_to_train_at_32_nodes_has_sequence_512_in_tf32_as_slow_as_its_table():
    """The 15.7-point miss (sequence 512 in TF32 at 32 nodes) is not one bad row: the same README
    trains BERT-large to the end on 32 DGX A100 nodes (its loss table, a run of its own) in 2.4
    hours in TF32 and 1.2 in mixed precision. Phase 1 is 7,038 steps of 65,536 sequences and phase
    2 1,563 of 32,768 (scripts/configs/pretrain_config.sh, dgxa100-80g_8gpu_*), at 32 nodes with
    the accumulation of the scaling table's 32-node rows. At the scaling table's rates they take
    1.21 and 2.36 hours (both as printed, rounded). At the model's rate for phase 2 in TF32,
    anywhere in its band, 2.22-2.28: 2.2 or 2.3 as printed, even with the time the mixed run
    spent beyond its rates (under 0.04 hours, as it prints 1.2) added. So the cost the model
    lacks is paid in every step of the whole of phase 2, not once in a benchmark's window."""
    from downpour_lib.perf.presets import BERT_NODES

    phase1, phase2 = 7038 * 65536, 1563 * 32768  # sequences

    def hours(model_128: str, rate_512: float) -> float:
        return (phase1 / BERT_NODES[model_128][-1][2] + phase2 / rate_512) / 3600

    mixed = hours("bert-large-128-amp", BERT_NODES["bert-large-512-amp"][-1][2])
    tf32 = hours("bert-large-128", BERT_NODES["bert-large-512"][-1][2])
    assert round(mixed, 1) == 1.2 and round(tf32, 1) == 2.4, (mixed, tf32)
    (check,) = [c for c in published_checks()
                if c.claim.startswith("BERT-large, sequence 512, TF32: 32 DGX")]
    one_node = BERT_NODES["bert-large-512"][0][2]
    beyond = 1.25 - mixed  # the most the mixed run can have spent beyond its rates
    for efficiency in (check.low, check.predicted, check.high):
        assert hours("bert-large-128", one_node * 32 * efficiency) + beyond < 2.35, efficiency
    # against the point, what "2.4" (2.35 to 2.45) leaves a step of phase 2, past the mixed run's
    # own time beyond its rates: paid every step, as the scaling table's 0.23-0.36 s are
    at_point = hours("bert-large-128", one_node * 32 * check.predicted)
    a_step = [(printed - at_point) * 3600 / 1563 for printed in (2.35 - beyond, 2.45)]
    assert a_step == pytest.approx([0.15, 0.46], abs=0.005), a_step


def test_the_band_holds_how_far_two_runs_of_one_setting_lie_apart():
    """A published efficiency is one measurement of a ratio of two runs. NVIDIA's BERT README
    measures one DGX A100's 8 GPUs twice (its single-node and its multi-node tables): those pairs
    are terms.REPEATED_RUNS, and the most they lie apart (0.83 %) is terms.MEASUREMENT_SPREAD. The
    efficiency's band is moved out by it at each end, for N workers against one and for N nodes
    against one node alike; the point, the step's band and one worker's efficiency (1, not a
    ratio of runs) do not move."""
    from downpour_lib.perf.perfmodel import _predict, unknown_ends
    from downpour_lib.perf.presets import BERT_NODES, BERT_ONE_NODE
    from downpour_lib.perf.terms import MEASUREMENT_SPREAD, REPEATED_RUNS

    runs = tuple((eight, BERT_NODES[model][0][2]) for model, _, eight in BERT_ONE_NODE[0][-1])
    assert sorted(runs) == sorted(REPEATED_RUNS)
    apart = [max(a, b) / min(a, b) - 1 for a, b in runs]
    assert MEASUREMENT_SPREAD == max(apart) and 0.008 < MEASUREMENT_SPREAD < 0.009
    assert min(apart) > 0.005  # every pair: not one outlier
    cal = PRESETS["horovod-pascal-25g"]
    best, worst = (_predict(e, "allreduce", 512, "resnet101") for e in unknown_ends(cal))
    p = predict(cal, "allreduce", 512, "resnet101")
    assert p.efficiency_low == pytest.approx(worst.efficiency * (1 - MEASUREMENT_SPREAD))
    assert p.efficiency_high == pytest.approx(best.efficiency * (1 + MEASUREMENT_SPREAD))
    assert (p.step_s_low, p.step_s_high) == (best.step_s, worst.step_s)
    assert worst.efficiency < p.efficiency < best.efficiency
    one = predict(cal, "allreduce", 1, "resnet101")
    assert one.efficiency_low == one.efficiency_high == 1.0
    # against one node: the two ends' ratios, moved out by the same spread (it cancels in them)
    checks = {c.claim: c for c in published_checks()}
    c = checks["BERT-large, sequence 128, TF32: 32 DGX A100 nodes (256 GPUs), 2 passes a step, "
               "efficiency against 1 node"]
    bert = PRESETS["dgx-a100-bert"]

    def at(accumulation, workers):  # each end's rate a GPU
        return [p.samples_per_s / workers
                for p in accumulating(bert, "bert-large-128", accumulation, workers)]

    ends = [far / base for far, base in zip(at(2, 256), at(64, 8), strict=True)]
    assert c.low == pytest.approx(min(ends) * (1 - MEASUREMENT_SPREAD))
    assert c.high == pytest.approx(max(ends) * (1 + MEASUREMENT_SPREAD))
    assert c.predicted == pytest.approx(sum(ends) / 2)
    # the README's 2 nodes faster than twice its 1 node: inside the spread, not beyond it
    two = checks["BERT-large, sequence 128, TF32: 2 DGX A100 nodes (16 GPUs), 32 passes a step, "
                 "efficiency against 1 node"]
    assert 1 < two.published < 1 + MEASUREMENT_SPREAD and two.outside_band == 0, two


def test_bert_in_tensorflow_loses_more_each_pass_as_the_ranks_grow():
    """NVIDIA's TensorFlow BERT (Horovod) on DGX A100 40GB nodes (presets.BERT_TF_ONE_NODE,
    BERT_TF_NODES), a check in another framework taken as found. One node's 8 GPUs are within a
    tenth of a point of their bands. Across nodes every setting loses more than the model at 32
    nodes, by 1 to 10 points, its largest error of the three counts of nodes. Counted per pass
    (one GPU's batch), the README's loss against one node grows with the ranks: at most 9.5 ms at
    32 GPUs, 6-21 at 128, 14-35 at 256 (its optimization.py allreduces a flag every pass: each pass
    waits for every rank; the model's slowest pass of 256 at the jitter's range is under 2.5 ms,
    docs/perf_model.md)."""
    from downpour_lib.perf.presets import BERT_TF_NODES, BERT_TF_PRESET, _bert_label
    from downpour_lib.perf.terms import JITTER_RANGE, expected_max_of_normals

    checks = [c for c in published_checks() if "TensorFlow" in c.claim]
    assert len(checks) == 16 and all(c.source.startswith("NVIDIA DeepLearningExamples, TensorFlow/")
                                     for c in checks)
    one_node = [c for c in checks if "8 GPUs of a DGX A100" in c.claim]
    assert len(one_node) == 4 and all(c.outside_band < 0.002 for c in one_node), one_node
    cal = PRESETS[BERT_TF_PRESET]
    per_pass_ms = {}
    for model, rows in BERT_TF_NODES.items():
        setting = [c for c in checks if c.claim.startswith(_bert_label(model) + ", TensorFlow:")
                   and "nodes" in c.claim]
        errors = [c.error for c in setting]
        assert len(errors) == 3 and errors[2] == max(errors), (model, errors)
        assert 0.01 < errors[2] < 0.10, (model, errors)
        per_pass_ms[model] = [1000 * s for s in lost_a_pass_s(BERT_TF_PRESET, model, rows)]
    at = list(zip(*per_pass_ms.values(), strict=True))  # 32 GPUs, 128, 256: the four settings each
    assert max(at[0]) < 9.5 and 6 < min(at[1]) <= max(at[1]) < 21 and 14 < min(at[2]) < max(at[2]) < 35
    # the wait for the slowest pass of 256 GPUs over 8, at the jitter's range, is under 2.5 ms
    pass_s = max(w.compute_s for w in cal.workloads.values())  # one GPU's pass, the longest
    slowest = (expected_max_of_normals(256) - expected_max_of_normals(8)) * JITTER_RANGE[1] * pass_s
    assert slowest < 0.0025 < min(at[2]) / 1000, slowest


def test_bert_in_paddlepaddle_loses_a_share_of_each_pass_across_nodes():
    """NVIDIA's PaddlePaddle BERT (fleet) on the PyTorch README's DGX A100 80GB nodes
    (presets.BERT_PADDLE_ONE_NODE, BERT_PADDLE_NODES), a check taken as found. One node's 8 GPUs
    are inside their bands. Across nodes all rows but one lose more than the model's point, by
    under 6 points, and 12 of 20 lie inside their bands (the wait for the slowest node, which costs
    every pass: terms.NODE_SPREAD_RANGE; the one: sequence 128 in mixed precision at 32 nodes, a
    pass a step, where the optimizer's update once a step costs most): already at 2 nodes each
    setting loses 3.5-6 % against one node, below each band, where PyTorch's BERT on the same
    nodes loses at most 1.4 %. The loss is a share of each pass, not seconds: at each count of
    nodes the four settings (two precisions, two sequence lengths; passes of 0.12 to 0.42 s) lose
    within about three points of each other, so the milliseconds a pass lose differ by about three
    times; at 32 nodes 10-12 %. Its multi-node table's one node is its single-node table's rows,
    not a run beside the others
    (docs/perf_model.md)."""
    from downpour_lib.perf.presets import (
        BERT_NODES,
        BERT_ONE_NODE,
        BERT_PADDLE_NODES,
        BERT_PADDLE_ONE_NODE,
        BERT_PADDLE_PRESET,
    )

    # its multi-node table's one node is its single-node table's 8 GPUs, number for number (not
    # measured again, as PyTorch's README measured its own)
    for one_node, nodes, copied in ((BERT_PADDLE_ONE_NODE, BERT_PADDLE_NODES, True),
                                    (BERT_ONE_NODE, BERT_NODES, False)):
        assert all((nodes[model][0][2] == eight) == copied for model, _, eight in one_node[0][-1])
    checks = [c for c in published_checks() if "PaddlePaddle" in c.claim]
    assert len(checks) == 24 and all(
        c.source.startswith("NVIDIA DeepLearningExamples, PaddlePaddle/") for c in checks)
    one_node = [c for c in checks if "8 GPUs of a DGX A100" in c.claim]
    assert len(one_node) == 4 and all(c.outside_band == 0 for c in one_node), one_node
    across = [c for c in checks if "nodes" in c.claim]
    assert len(across) == 20 and all(-0.02 < c.error < 0.06 for c in across), across
    assert sum(c.error > 0 for c in across) == 19, across
    assert sum(c.outside_band == 0 for c in across) >= 12, across
    assert all(c.outside_band > 0 for c in across if ": 2 DGX A100 nodes" in c.claim), across

    shares = {model: lost_share(rows) for model, rows in BERT_PADDLE_NODES.items()}
    at = list(zip(*shares.values(), strict=True))  # 2, 4, 8, 16, 32 nodes: the four settings each
    assert all(0.035 < s < 0.06 for s in at[0]) and all(0.10 < s < 0.12 for s in at[-1]), at
    assert all(max(settings) - min(settings) < 0.035 for settings in at), at
    assert max(lost_share(rows)[0] for rows in BERT_NODES.values()) < 0.015
    ms = [1000 * s for model, rows in BERT_PADDLE_NODES.items()
          for s in lost_a_pass_s(BERT_PADDLE_PRESET, model, rows)[-1:]]
    assert max(ms) > 3 * min(ms), ms  # at 32 nodes, per pass: not a fixed cost


def test_paddles_eight_messages_are_not_what_the_model_misses():
    """fleet's graph path (program.py does not set without_graph_optimization) fuses the merged
    gradients into messages of 50 (fuse_grad_size_in_TFLOPS's default, by count where
    fuse_grad_size_in_MB is 0): 8 for BERT-large's 398 tensors. Sent after the last pass, 8 cost
    the model at most 0.3 point against the one its preset assumes; sent as the last pass's
    backward makes them (overlap not measured: its range), they keep up to 2.5 points more. One
    message after the last pass is the least the model keeps, and every row but one lies below
    even that (docs/perf_model.md; the one: a pass a step, where the optimizer costs most)."""
    from downpour_lib.perf.presets import BERT_PADDLE_NODES, BERT_PADDLE_PRESET

    cal = PRESETS[BERT_PADDLE_PRESET]
    eight = cal.workloads["bert-large-128"].param_bytes / 8

    def kept(c):  # every row's efficiency against one node, as the checks compute it
        def at(model, accumulation, workers):  # the point's rate a GPU: the middle of its ends
            return sum(p.samples_per_s for p in accumulating(c, model, accumulation, workers)) / 2 / workers

        return [at(model, acc, 8 * n) / at(model, rows[0][1], 8)
                for model, rows in BERT_PADDLE_NODES.items() for n, acc, _ in rows[1:]]

    one = kept(cal)
    after = kept(replace(cal, bucket_bytes=eight, overlap=0.0))
    overlapped = kept(replace(cal, bucket_bytes=eight))
    assert all(0 <= a - b < 0.003 for a, b in zip(one, after, strict=True)), (one, after)
    assert 0.02 < max(b - a for a, b in zip(one, overlapped, strict=True)) < 0.03
    published = [rate / rows[0][2] / n for rows in BERT_PADDLE_NODES.values()
                 for n, _, rate in rows[1:]]
    assert sum(p < a for p, a in zip(published, after, strict=True)) == len(published) - 1


def lost_share(rows) -> list[float]:
    """The share of its rate each row of N nodes (``presets.BERT_NODES``' rows: the first one node)
    loses against N times the one node."""
    (_, _, one), *more = rows
    return [1 - rate / one / nodes for nodes, _, rate in more]


def lost_a_pass_s(preset: str, model: str, rows) -> list[float]:
    """Seconds a pass (one GPU's batch of ``preset``'s ``model``) takes at each row of N DGX A100
    nodes (``presets.BERT_NODES``' rows: the first one node) beyond the one node's pass."""
    batch = PRESETS[preset].workloads[model].batch_size
    (_, _, one), *more = rows
    return [batch * 8 * (nodes / rate - 1 / one) for nodes, _, rate in more]


def test_bert_counts_the_mlm_head_on_the_masked_tokens_only():
    """The BERT presets' ``multiply_adds`` (the framework's unit): NVIDIA's run_pretraining.py (the
    README's commit) runs its MLM head only on the masked tokens by default (dense sequence output:
    20 of 128, 80 of 512), the encoder on every token. Counted again here, and the unit it gives:
    a sequence of 128 does 119 multiply-adds a parameter (more framework work a sample than an
    image's 172 gives), one of 512, 506 (less); mixed precision halves it (2-byte gradients)."""
    from downpour_lib.perf.hardware import HARDWARE_DIR, read_hardware
    from downpour_lib.perf.terms import FRAMEWORK_MACS_PER_PARAMETER

    d, inner, layers, vocab = 1024, 4096, 24, 30528

    def sequence(tokens, masked):  # q, k, v, output; feed-forward; attention; MLM head; pooler, NSP
        encoder = tokens * layers * (4 * d * d + 2 * d * inner + 2 * tokens * d)
        return encoder + masked * (d * d + d * vocab) + d * d + 2 * d

    for preset, count in (("dgx-a100-bert", "bert-large"), ("dgx1-v100-32g-bert", "bert-large"),
                          ("dgx-a100-bert-tf", "bert-large-tf"),  # TensorFlow's: 30522 words
                          ("dgx-a100-bert-paddle", "bert-large-tf")):  # and PaddlePaddle's
        models = read_hardware(HARDWARE_DIR / f"{preset}.yaml")["models"]
        for tokens, masked in ((128, 20), (512, 80)):
            macs = models[f"bert-large-{tokens}"]["multiply_adds"]
            assert macs == pytest.approx(sequence(tokens, masked), rel=1e-4), (preset, tokens)
            w = PRESETS[preset].workloads[f"bert-large-{tokens}"]
            per_parameter = FRAMEWORK_MACS_PER_PARAMETER * PARAMETERS[count] / macs
            assert w.framework_sample_s == pytest.approx(per_parameter * w.compute_s / w.batch_size)
            assert (per_parameter > 1) == (tokens == 128), per_parameter
            amp = PRESETS[preset].workloads[f"bert-large-{tokens}-amp"]
            gradient_bytes = amp.param_bytes / w.param_bytes  # a half: PaddlePaddle's stay fp32
            assert amp.framework_sample_s == pytest.approx(w.framework_sample_s * gradient_bytes)


def test_transformer_xl_counts_the_framework_in_parameters_worth_of_its_compute():
    """NVIDIA's Transformer-XL large on DGX-2H nodes (presets.TXL_ONE_NODE, TXL_NODES). One node's
    16 GPUs lose 6 % (FP32) and 11 % (mixed precision) against one GPU. Charged the framework's
    work in samples (terms.FRAMEWORK_RANGE, fitted on images), a step of 8 sequences of 384 tokens
    lost 23 % and 45 %: the unit did not carry from images to sequences. Counted per parameter
    (terms.FRAMEWORK_MACS_PER_PARAMETER: a sequence does 440 multiply-adds a parameter, an image
    of DDP's benchmark 172) and per byte of gradient (apex O2's are 2), both rows come within 6
    points, below the README. These two rows chose that unit; they are not blind checks any more.
    Across nodes (4 sequences a GPU, weak scaling) the model gives 2 and 4 nodes within a point
    and loses less than the README at 8: the gap grows with the nodes, as BERT's TF32 rows do,
    and is largest at full precision."""
    from downpour_lib.perf.hardware import HARDWARE_DIR, read_hardware
    from downpour_lib.perf.presets import TXL_NODES, TXL_ONE_NODE, TXL_PRESET
    from downpour_lib.perf.terms import FRAMEWORK_MACS_PER_PARAMETER

    # the preset's multiply-adds of a sequence (wt103_large.yaml): 384 tokens, 18 layers of
    # d_model 1024, 16 heads of 64, d_inner 4096, 384 tokens of memory, a 20,000-word head
    d, heads, inner, tokens, keys = 1024, 16 * 64, 4096, 384, 384 + 384
    layer = 3 * d * heads + keys * d * heads / tokens + 3 * heads * keys + heads * d + 2 * d * inner
    sequence = tokens * (18 * layer + d * (19997 + 3))
    cal = PRESETS[TXL_PRESET]
    for model in ("transformer-xl-large", "transformer-xl-large-b4"):
        macs = read_hardware(HARDWARE_DIR / f"{TXL_PRESET}.yaml")["models"][model]["multiply_adds"]
        assert macs == pytest.approx(sequence, rel=1e-4)
        w = cal.workloads[model]
        per_parameter = FRAMEWORK_MACS_PER_PARAMETER * PARAMETERS["transformer-xl-large"] / macs
        assert w.framework_sample_s == pytest.approx(per_parameter * w.compute_s / w.batch_size)
        amp = cal.workloads[f"{model}-amp"]
        assert amp.framework_sample_s == pytest.approx(w.framework_sample_s / 2)  # 2-byte gradients
    checks = {c.claim: c for c in published_checks() if "Transformer-XL" in c.claim}
    assert len(checks) == len(TXL_ONE_NODE) + sum(len(rows) - 1 for rows in TXL_NODES.values())
    twin = cal.workloads["transformer-xl-large"]  # the mixed-precision row's full-precision model
    for model, precision, one, sixteen in TXL_ONE_NODE:
        c = checks[f"Transformer-XL large, {precision}: 16 GPUs of a DGX-2H efficiency"]
        assert c.published == pytest.approx(sixteen / 16 / one)
        assert -0.06 < c.error < 0 and c.outside_band < 0.02, c
        in_samples = replace(cal.workloads[model], framework_sample_s=None if precision == "FP32"
                             else twin.compute_s / twin.batch_size)
        old = predict(replace(cal, workloads={**cal.workloads, model: in_samples}), "allreduce", 16,
                      model)
        assert old.efficiency < c.published - 0.15, (model, old.efficiency)  # the unit in samples
    for precision in ("FP32", "mixed precision"):
        errors = [c.error for claim, c in checks.items() if claim.startswith(
            f"Transformer-XL large, {precision}: ") and "nodes" in claim]
        assert len(errors) == 3 and errors == sorted(errors), errors
        assert all(abs(e) < 0.01 for e in errors[:2]) and errors[2] > 0.01, errors
    at_8 = {p: checks[f"Transformer-XL large, {p}: 8 DGX-2H nodes (128 GPUs), 4 sequences a GPU, "
                      "efficiency against 1 node"] for p in ("FP32", "mixed precision")}
    assert at_8["FP32"].error > at_8["mixed precision"].error > 0.01, at_8


def test_the_framework_unit_is_the_mean_image_of_ddps_benchmark():
    """terms.FRAMEWORK_MACS_PER_PARAMETER: the forward multiply-adds a parameter of a 224-pixel
    image through DDP's benchmark models, counted again (torch's FLOP counter, meta device)."""
    import torch
    import torchvision
    from torch.utils.flop_counter import FlopCounterMode

    from downpour_lib.perf.terms import DDP_BENCH, FRAMEWORK_MACS_PER_PARAMETER

    per_parameter = []
    for name in DDP_BENCH:
        with torch.device("meta"):
            model = getattr(torchvision.models, name)()
            image = torch.empty(1, 3, 224, 224)
        with FlopCounterMode(display=False) as counter:
            model.eval()(image)
        per_parameter.append(counter.get_total_flops() / 2 / sum(p.numel() for p in model.parameters()))
    assert per_parameter == pytest.approx([160.0, 175.1, 169.0, 184.9], abs=0.05)
    assert FRAMEWORK_MACS_PER_PARAMETER == pytest.approx(sum(per_parameter) / 4, abs=0.05)


def test_a_node_term_fitted_on_accumulating_steps_gives_its_table_back():
    """The fit takes off what the model adds to a step beyond the node's loss, as a share of one
    pass: a table of models that accumulate many passes a step (BERT's) gives its own 8-GPU
    efficiency back, not a share that counted every pass as extra."""
    from downpour_lib.perf.hardware import _fit_table, hardware_from_dict
    from downpour_lib.perf.terms import TableRow

    spec = {"devices_per_node": 8, "overlap": 1.0, "jitter": 0.0, "framework": 2.0,
            "node_compute": "none", "links": {"intra": {"gbit_per_s": 1200}},
            "models": {m: {"batch": 32, "accumulation": 64, "images_per_s": 50,
                           "parameters": 3e8, **({"precision": "amp"} if m == "amp" else {})}
                       for m in ("full", "amp")}}
    cal = hardware_from_dict(spec)
    table = (TableRow("fp32", 1, 50), TableRow("fp32", 8, 0.97 * 8 * 50),
             TableRow("amp", 1, 50), TableRow("amp", 8, 0.95 * 8 * 50))
    node = _fit_table(cal, table, "a test table", {"fp32": "full", "amp": "amp"})
    assert 0 < node.fp32 < node.amp < 0.06
    fitted = replace(cal, node_compute=node)
    for model, kept in (("full", 0.97), ("amp", 0.95)):
        assert predict(fitted, "allreduce", 8, model).efficiency == pytest.approx(kept, abs=1e-6)


def test_the_band_says_what_to_measure_first(capsys):
    """Each unmeasured quantity, measured at its range's middle while the others stay ranges,
    leaves a band no wider than all of them give together; VGG-16's 411 MB of gradients on 25
    Gbit/s make the overlap the widest part of its band. All measured: nothing to pin."""
    from downpour_lib.cli import main
    from downpour_lib.perf.perfmodel import band_parts, pinned, unknown_ends

    cal = PRESETS["horovod-pascal-25g"]
    whole = predict(cal, "allreduce", 512, "vgg16")
    parts = band_parts(cal, "allreduce", 512, "vgg16")
    assert set(parts) == set(pinned(cal)) >= {"overlap", "the cross-node rate", "jitter"}
    assert all(width <= 100 * (whole.efficiency_high - whole.efficiency_low) + 1e-9
               for width in parts.values()), parts
    assert next(iter(parts)) == "overlap" and parts["overlap"] < parts["the cross-node rate"], parts
    measured = cal
    for one in pinned(cal).values():  # pin each in turn: one at a time, then none is left
        measured = replace(measured, **{f: getattr(one, f) for f in (
            "overlap", "inter_rate", "jitter", "jitter_high", "device_spread", "device_spread_high",
            "node_spread", "node_spread_high", "framework")
            if getattr(one, f) != getattr(cal, f)})
    measured = replace(measured, node_compute=pinned(cal)["a busy node's share"].node_compute,
                       workloads=pinned(cal)["a busy node's share"].workloads)
    assert pinned(measured) == {} and unknown_ends(measured) is None  # the two lists agree
    assert all(unknown_ends(one) is not None for one in pinned(cal).values())  # one pinned: more left
    assert main(["model", "predict", "--preset", "horovod-pascal-25g", "--model", "vgg16",
                 "--workers", "8,512"]) == 0
    line = next(s for s in capsys.readouterr().out.splitlines() if s.startswith("measure first:"))
    assert "allreduce at 8 workers" in line and ": overlap " in line, line


def test_a_model_of_few_multiply_adds_a_parameter_is_told_the_framework_unit_is_not_its(tmp_path, capsys):
    """The framework's work, counted in parameters' worth of a model's own compute, was measured
    on models of 160-440 multiply-adds a parameter: a small MLP's 1 (its samples mostly fixed
    costs) makes it several steps' compute, which a note says; BERT's presets get none."""
    import yaml

    from downpour_lib.cli import main

    mine = {"name": "mine", "source": "a test", "devices_per_node": 8, "overlap": None,
            "links": {"intra": {"gbit_per_s": 300, "latency_us": 3, "efficiency": 0.9, "source": "x"}},
            "models": {"mlp": {"batch": 64, "images_per_s": 5000, "parameters": 14084,
                               "multiply_adds": 13824, "source": "x"}}}
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(mine))
    assert main(["model", "predict", "--hardware", str(path), "--model", "mlp", "--workers", "2"]) == 0
    out = capsys.readouterr().out
    assert "note: mlp does 0.982 multiply-adds a parameter in a sample, the framework's work was " \
           "measured on models of 160 to 440" in out and "or give --framework" in out, out
    assert main(["model", "predict", "--preset", "dgx-a100-bert", "--model", "bert-large-128",
                 "--workers", "16"]) == 0
    assert "note:" not in capsys.readouterr().out
