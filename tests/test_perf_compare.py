"""Comparing algorithms on hardware nobody here measured: what neither measured sits at the same end
for both, so the band of a speedup is the ratio of the ends, not the two bands crossed; and the
fastest-algorithm map says where the unknowns decide which algorithm wins."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from conftest import downpour, explain

from downpour_lib.perf.hardware import with_fields
from downpour_lib.perf.perfmodel import predict, predict_ends, predict_rows, relative, unknown_ends
from downpour_lib.perf.presets import PRESETS
from downpour_lib.perf.terms import MEASUREMENT_SPREAD as SPREAD
from downpour_lib.study import model_plots

ALGORITHMS = ["allreduce", "sgp", "osgp", "localsgd", "diloco"]


@pytest.mark.parametrize("preset, workers", [("sgp-v100-10g", 32), ("dgx-a100", 64)])
def test_a_speedup_divides_each_end_by_the_same_end(preset, workers):
    """The reference: each end of the unknowns as a calibration of its own (``unknown_ends``),
    predicted there with nothing left unmeasured, and the two throughputs divided."""
    cal = PRESETS[preset]
    best_cal, worst_cal = unknown_ends(cal)
    for a in ALGORITHMS[1:]:
        ratios = [predict(c, a, workers, "resnet50").samples_per_s
                  / predict(c, "allreduce", workers, "resnet50").samples_per_s
                  for c in (best_cal, worst_cal)]
        point, low, high = relative(predict_ends(cal, a, workers, "resnet50"),
                                    predict_ends(cal, "allreduce", workers, "resnet50"))
        assert point == pytest.approx(sum(ratios) / 2, rel=1e-12)
        assert low == pytest.approx(min(ratios) * (1 - SPREAD), rel=1e-12)
        assert high == pytest.approx(max(ratios) * (1 + SPREAD), rel=1e-12)
        # sharing the unknowns is worth something: the two bands crossed are wider
        p, b = (predict(cal, x, workers, "resnet50") for x in (a, "allreduce"))
        assert high - low < p.efficiency_high / b.efficiency_low - p.efficiency_low / b.efficiency_high


def test_with_everything_measured_a_speedup_is_a_point_and_two_runs_spread():
    cal = with_fields(PRESETS["dgx-a100"], overlap=0.8, jitter=0.01, device_spread=0.01,
                      node_spread=0.02, framework=2.0, inter_gbit=1600, link_efficiency=0.9,
                      node_compute={"fp32": 0.01, "amp": 0.12})
    assert unknown_ends(cal) is None
    ends = predict_ends(cal, "localsgd", 64, "resnet50")
    assert ends[0] is ends[1]
    ratio = ends[0].samples_per_s / predict(cal, "allreduce", 64, "resnet50").samples_per_s
    assert relative(ends, predict_ends(cal, "allreduce", 64, "resnet50")) == pytest.approx(
        (ratio, ratio * (1 - SPREAD), ratio * (1 + SPREAD)), rel=1e-12)


def test_rows_against_an_algorithm_carry_its_speedup_and_a_verdict():
    cal = PRESETS["sgp-v100-10g"]
    rows = predict_rows(cal, ALGORITHMS, [4, 32], "resnet50", against="allreduce")
    plain = predict_rows(cal, ALGORITHMS, [4, 32], "resnet50")
    assert [{k: r[k] for k in p} for r, p in zip(rows, plain, strict=True)] == plain  # nothing else moves
    for r in rows:
        if r["algorithm"] == "allreduce":
            assert (r["speedup"], r["verdict"]) == (1.0, "reference"), r
            continue
        assert r["speedup_low"] < r["speedup"] < r["speedup_high"], r
        expected = ("faster" if r["speedup_low"] > 1 else "slower" if r["speedup_high"] < 1
                    else "either")
        assert r["verdict"] == expected, r
    verdicts = {(r["algorithm"], r["workers"]): r["verdict"] for r in rows}
    # SGP's paper: on 10 GbE, 32 nodes, its overlapped gossip beats AllReduce SGD whatever the
    # unknowns; at 4 nodes plain SGP's one peer is no faster than the ring, within the band
    assert verdicts["osgp", 32] == "faster" and verdicts["sgp", 4] == "either", verdicts


def test_model_predict_prints_the_speedup_against_the_first_algorithm(tmp_path):
    out = tmp_path / "rows.json"
    proc = downpour("model", "predict", "--preset", "sgp-v100-10g", "--model", "resnet50",
                    "--algorithm", "allreduce,osgp,sgp", "--workers", "32", "--json", str(out))
    assert proc.returncode == 0, explain(proc)
    assert "speedup: samples/s over allreduce's at the same workers" in proc.stdout, proc.stdout
    header = next(line for line in proc.stdout.splitlines() if line.lstrip().startswith("algorithm"))
    assert header.split()[-4:] == ["speedup", "speedup_low", "speedup_high", "verdict"], header
    rows = {r["algorithm"]: r for r in json.loads(out.read_text())}
    assert rows["allreduce"]["verdict"] == "reference" and rows["osgp"]["verdict"] == "faster"
    proc = downpour("model", "predict", "--preset", "sgp-v100-10g", "--model", "resnet50",
                    "--algorithm", "osgp", "--against", "sgp", "--workers", "32")
    assert proc.returncode == 0 and "samples/s over sgp's" in proc.stdout, explain(proc)
    one = downpour("model", "predict", "--preset", "sgp-v100-10g", "--model", "resnet50",
                   "--workers", "32")
    assert one.returncode == 0 and "speedup" not in one.stdout, explain(one)  # one algorithm
    bad = downpour("model", "predict", "--preset", "sgp-v100-10g", "--model", "resnet50",
                   "--algorithm", "osgp", "--against", "gosip")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, explain(bad)
    assert "against='gosip'" in bad.stderr and "sgp" in bad.stderr, bad.stderr


@pytest.mark.parametrize("preset, model, rate", [("horovod-pascal-25g", "resnet101", 25),
                                                 ("sgp-v100-10g", "resnet50", 10)])
def test_the_fastest_map_at_the_presets_own_line_rate_is_the_preset(preset, model, rate):
    """The map re-rates the card and keeps its transport: at the preset's own rate every cell is
    what ``model predict`` gives on the preset, and a TCP card at another rate takes that rate's
    range (TCP's caps: ``terms.transport_rate``)."""
    cal = PRESETS[preset]
    table = model_plots.fastest_map(cal, ALGORITHMS, model, workers=[8, 64], gbits=[rate, 100])
    for row in table[table.gbit == rate].itertuples():
        assert row.samples_per_s == pytest.approx(
            predict(cal, row.algorithm, row.workers, model).samples_per_s, rel=1e-12), row
    at_100 = with_fields(cal, inter_gbit=100, inter_transport=cal.inter_transport)
    for row in table[table.gbit == 100].itertuples():
        assert row.samples_per_s == pytest.approx(
            predict(at_100, row.algorithm, row.workers, model).samples_per_s, rel=1e-12), row


def test_the_fastest_map_names_the_algorithm_that_wins_at_the_other_end():
    cal = PRESETS["horovod-pascal-25g"]
    table = model_plots.fastest_map(cal, ALGORITHMS, "resnet101", gbits=[1, 10, 25])
    for (gbit, workers), cell in table.groupby(["gbit", "workers"]):
        winner = cell[cell.fastest].algorithm.tolist()
        assert len(winner) == 1, cell
        at_ends = []  # the favourable end's winner, then the unfavourable end's
        for end in ("step_s_low", "step_s_high"):  # the map's rule: within 1 % goes to the first
            rates = dict(zip(cell.algorithm, 1 / cell[end], strict=True))
            top = max(rates.values())
            at_ends.append(next(a for a in ALGORITHMS if rates[a] >= 0.99 * top))
        others = list(dict.fromkeys(a for a in at_ends if a not in winner))
        assert set(cell.contender) == {", ".join(others)}, (gbit, workers, at_ends)
        assert (cell.settled == (cell.contender == "")).all()
    assert table.settled.any() and not table.settled.all()  # both kinds on this preset
    figure = model_plots.fastest_map_figure(table)
    labels = [t.get_text() for t in figure.axes[0].texts]
    assert any("\nor " in label for label in labels), labels


def test_a_checks_file_takes_an_algorithm_its_options_and_a_speedup_claim(tmp_path):
    """perf.checks_file: a row of another algorithm is its efficiency against one worker, as
    ``predict`` gives it with the row's options; a row with ``against_algorithm`` is a speedup,
    the same as the package's SGP row where it restates it."""
    from downpour_lib.errors import ConfigError
    from downpour_lib.perf.checks_file import checks_from_file
    from downpour_lib.perf.presets import published_checks

    (tmp_path / "mine.csv").write_text(
        "claim,hardware,model,workers,algorithm,options,against_algorithm,published\n"
        "sgp,sgp-v100-10g,resnet50,32,osgp,,allreduce,3.0\n"
        "local,sgp-v100-10g,resnet50,32,localsgd,period=8,,0.7\n"
        "ring,sgp-v100-10g,resnet50,32,,,,0.4\n")
    speedup, local, ring = checks_from_file(tmp_path / "mine.csv")
    theirs = next(c for c in published_checks() if c.claim.startswith("SGP"))
    assert (speedup.unit, speedup.kind) == ("speedup", "")
    assert (speedup.predicted, speedup.low, speedup.high) == (theirs.predicted, theirs.low, theirs.high)
    cal = PRESETS["sgp-v100-10g"]
    for check, algorithm, options in ((local, "localsgd", {"period": 8}), (ring, "allreduce", None)):
        p = predict(cal, algorithm, 32, "resnet50", options)
        assert (check.unit, check.predicted, check.low, check.high) == (
            "efficiency", p.efficiency, p.efficiency_low, p.efficiency_high), check
    assert local.predicted != predict(cal, "localsgd", 32, "resnet50").efficiency  # period read
    proc = downpour("model", "check", "--checks", str(tmp_path / "mine.csv"))
    assert proc.returncode == 0, explain(proc)
    assert "efficiency checks: 2;" in proc.stdout and "speedup checks: 1; inside the band: 0 of 1" \
        in proc.stdout, proc.stdout
    header = "claim,hardware,model,workers,against,algorithm,options,against_algorithm,published\n"
    for row, match in (
            ("x,sgp-v100-10g,resnet50,32,,localsgd,period=0,,0.7", "row 1 options period=0"),
            ("x,sgp-v100-10g,resnet50,32,,localsgd,servers=2,,0.7",
             "row 1 options='servers=2'.*keys a prediction reads: period"),
            ("x,sgp-v100-10g,resnet50,32,,osgp,,alreduce,3", "row 1 against_algorithm='alreduce'"),
            ("x,sgp-v100-10g,resnet50,32,,gosip,,,0.5", "row 1 algorithm='gosip'"),
            ("x,sgp-v100-10g,resnet50,32,4,osgp,,allreduce,3", "row 1 against=4.*empty with against"),
            ("x,sgp-v100-10g,resnet50,32,,osgp,,allreduce,-1", "row 1 published='-1'.*speedup")):
        (tmp_path / "bad.csv").write_text(header + row + "\n")
        with pytest.raises(ConfigError, match=match):
            checks_from_file(tmp_path / "bad.csv")
    (tmp_path / "only.csv").write_text(header + "x,sgp-v100-10g,resnet50,32,,osgp,,allreduce,3\n")
    proc = downpour("model", "check", "--checks", str(tmp_path / "only.csv"), "--figure",
                    str(tmp_path / "f.png"))
    assert proc.returncode == 2 and "only speedups" in proc.stderr, explain(proc)
    assert not (tmp_path / "f.png").exists()


def test_model_predict_draws_each_algorithms_band_and_its_speedup(tmp_path):
    """``model predict --figure``: a curve a panel for each algorithm, its band shaded where the
    calibration leaves it one, and the speedups beside the efficiencies when there is a reference."""
    from matplotlib.collections import PolyCollection

    rows = pd.DataFrame(predict_rows(PRESETS["sgp-v100-10g"], ["allreduce", "osgp", "localsgd"],
                                     [2, 8, 32], "resnet50", against="allreduce"))
    efficiency, speedup = model_plots.prediction_figure(rows).axes
    for ax, low, high in ((efficiency, "efficiency_low", "efficiency_high"),
                          (speedup, "speedup_low", "speedup_high")):
        assert [line.get_label() for line in ax.get_lines()] == ["allreduce", "osgp", "localsgd"]
        bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
        # allreduce against itself is a point: no band on the speedups
        assert len(bands) == (3 if ax is efficiency else 2), (ax.get_ylabel(), bands)
        osgp = rows[rows.algorithm == "osgp"]
        assert ax.get_lines()[1].get_ydata().tolist() == osgp[low.rsplit("_", 1)[0]].tolist()
        top = max(v[1] for b in bands for v in b.get_paths()[0].vertices)
        assert top == pytest.approx(rows[high].max())
    alone = pd.DataFrame(predict_rows(PRESETS["sgp-v100-10g"], ["osgp"], [2, 8], "resnet50"))
    assert len(model_plots.prediction_figure(alone).axes) == 1
    out = tmp_path / "p.png"
    proc = downpour("model", "predict", "--preset", "sgp-v100-10g", "--model", "resnet50",
                    "--algorithm", "allreduce,osgp", "--workers", "2,32", "--figure", str(out))
    assert proc.returncode == 0 and out.stat().st_size > 0, explain(proc)
    bad = downpour("model", "predict", "--preset", "sgp-v100-10g", "--model", "resnet50",
                   "--figure", str(tmp_path / "p.txt"))
    assert bad.returncode == 2 and "figure=" in bad.stderr and ".png" in bad.stderr, explain(bad)


def test_a_tcp_cards_range_is_taken_again_for_another_count_of_ranks():
    """A calibration keeps its card's transport (``inter_transport``) where the rate is the
    published range: more ranks sharing a TCP card take the range again, from its line rate."""
    from downpour_lib.errors import ConfigError
    from downpour_lib.perf.hardware import hardware_from_dict

    def card(per_node, **link):
        return hardware_from_dict({"devices_per_node": per_node,
                                   "links": {"inter": {"gbit_per_s": 25, **link}},
                                   "models": {"net": {"batch": 32, "step_s": 0.2,
                                                      "parameters": 1e6}}})

    one, four, eight = (card(n, transport="tcp") for n in (1, 4, 8))
    assert (four.inter_transport, card(4, transport="tcp", efficiency=0.5).inter_transport,
            card(4).inter_transport) == ("tcp", None, None)
    assert one.inter_rate != four.inter_rate  # one rank a card moves more of it than several
    with pytest.raises(ConfigError, match="devices_per_node=4 .*--inter-gbit G --inter-transport tcp"):
        with_fields(one, devices_per_node=4)
    again = with_fields(one, devices_per_node=4, inter_gbit=25, inter_transport="tcp")
    assert (again.network.inter, again.inter_rate, again.inter_transport) == (
        four.network.inter, four.inter_rate, "tcp")
    more = with_fields(four, devices_per_node=8)  # several ranks either way: the same range
    assert (more.network.inter, more.inter_rate) == (eight.network.inter, eight.inter_rate)
    # the file's rate again, by flag: its transport and range kept (a 26-point band had become 14)
    kept = with_fields(four, inter_gbit=25)
    assert (kept.network.inter, kept.inter_rate, kept.inter_transport) == (
        four.network.inter, four.inter_rate, "tcp")
    assert with_fields(four, inter_gbit=25, link_efficiency=0.9).inter_transport is None  # measured
    assert with_fields(card(4), inter_gbit=25).inter_transport is None  # fitted, as the file's
