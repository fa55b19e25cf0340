"""Latency under traffic in the bench report: the at-target table, the capacity table, the harness's own share,
the latency-load curve, and a report without traffic rendering as it did before."""
from __future__ import annotations

import copy

import pytest

import matplotlib.pyplot as plt

from serve_bench.report import plots, tables as report_tables
from serve_bench.report_model import Capacity
from tests.report_entries import as_report
from serve_bench.report.files import figures, render_html, render_markdown
from serve_bench.report.traffic import (CAPACITY_TITLE, TRAFFIC_TITLE, capacity_table, capacity_text,
                                        overhead_line, traffic_sections, traffic_table)

B1 = {"max_batch": 1, "max_queue_delay_us": 0, "instances": 1, "threads": 1}
B8 = {"max_batch": 8, "max_queue_delay_us": 500, "instances": 1, "threads": 2}
B8X2 = {"max_batch": 8, "max_queue_delay_us": 500, "instances": 2, "threads": 1}
NOT_KEPT_UP = "not sustainable: completed 150.0/s of 200.0/s offered (the queue grows without bound)"


def _run(qps, p50, p99, ci=None, *, scenario="server", serving=B1, valid=True, reasons=(), sustainable=True,
         reason="sustainable", queue=0.2, compute=0.5, batch=1.0):
    run = {"scenario": scenario, "offered_qps": qps, "scheduled_qps": qps, "completed_qps": qps, "queries": 1000,
           "wall_s": 10.0, "latency_ms": {"p50": p50, "p90": p99, "p95": p99, "p99": p99, "p999": p99, "mean": p50},
           "p99_ci": ci, "loadgen": {"valid": valid, "invalid_reasons": list(reasons), "early_stopping": [],
                                     "latency_ms": {"p50": p50, "p99": p99}},
           "queue_ms": {"mean": queue, "p50": queue, "p99": queue}, "compute_ms": {"mean": compute, "p50": compute,
                                                                              "p99": compute},
           "mean_batch": batch, "serving": serving, "within_budget": {"point": p99 <= 2.0, "confident": valid}}
    if scenario == "server":
        run["sustainable"], run["sustainable_reason"] = sustainable, reason
    return run


def _cap(qps, ci, bracket, reason):
    status = "ok" if qps is not None else ("not_sustainable" if reason.startswith("not sustainable")
                                           else "none_within_budget")
    return {"qps": qps, "ci": ci, "bracket": bracket, "sustainable": qps is not None, "reason": reason,
            "rule": "point", "status": status, "censored": qps is not None and bracket[1] is None}


def _sweep() -> dict:
    b1 = {"label": "b1", "serving": B1, "offline": _run(None, 1.0, 2.0, scenario="offline") | {"completed_qps": 610.0},
          "curve": [_run(200.0, 0.6, 1.2, [1.1, 1.4]), _run(400.0, 0.8, 1.8, [1.6, 2.1]),
                    _run(600.0, 4.0, 9.0, [7.0, 12.0], sustainable=False, reason=NOT_KEPT_UP)],
          "capacity": _cap(400.0, [200.0, 400.0], [400.0, 600.0], "400.0 queries/s within the budget")}
    b8 = {"label": "b8", "serving": B8, "offline": _run(None, 1.0, 2.0, scenario="offline") | {"completed_qps": 1234.5},
          "curve": [_run(q, 0.5, 0.9, [0.8, 1.0], serving=B8, batch=2.5) for q in (200.0, 400.0, 800.0, 1000.0)],
          "capacity": _cap(1000.0, [800.0, None], [1000.0, None], "1,000.0 queries/s within the budget")}
    b8x2 = {"label": "b8x2", "serving": B8X2, "offline": None,
            "curve": [_run(200.0, 3.0, 5.0, None, serving=B8X2, sustainable=False, reason=NOT_KEPT_UP)],
            "capacity": _cap(None, [None, None], [None, 200.0], f"not sustainable even at 200.0/s: {NOT_KEPT_UP}")}
    return {"configs": [b1, b8, b8x2], "best": {"label": "b8", "serving": B8, "capacity": b8["capacity"]},
            "batching_gain": {"ratio": 2.5, "ci": [1.9, None], "over": "b1"}}


def _artifact(name: str, traffic: dict | None = None) -> dict:
    art = {"name": name, "runtime": "onnxruntime", "precision": name, "accuracy": {"top1": 91.0},
           "latency_ms": {"p50": 0.4, "p99": 0.9, "p99_ci": [0.8, 1.0]}, "speedup_p99": 1.0, "throughput": 2500.0,
           "size_bytes": 2**20}
    if traffic is not None:
        art["traffic"] = traffic
    return art


def _plain_report() -> dict:
    return {"pipeline": "quickstart", "metric": "top1", "baseline": "fp32",
            "gate": {"passed": True, "release": "int8", "reasons": [], "decision": "point",
                     "limits": {"metric": "top1", "max_drop": 0.5, "p99_budget_ms": 2.0, "decision": "point"}},
            "artifacts": [_artifact("fp32"), _artifact("int8"), _artifact("onnx")], "settings": {}}


@pytest.fixture
def report() -> dict:
    out = _plain_report()
    fp32, int8, _ = out["artifacts"]
    int8["traffic"] = {"scenario": "server", "target_qps": 500.0, "sweep": _sweep(), "machine_load": None,
                       "at_target": _run(500.0, 0.61, 1.5, [1.25, 1.75], serving=B8, batch=2.25)}
    fp32["traffic"] = {"scenario": "server", "target_qps": 500.0, "sweep": None, "machine_load": None,
                       "at_target": _run(500.0, 3.2, 12.5, [11.0, 14.25], valid=False, sustainable=False,
                                         reasons=["Reduce target QPS to improve latency", "Too few queries"],
                                         reason=NOT_KEPT_UP, queue=9.5, compute=0.75)}
    out["traffic"] = {"scenario": "server", "target_qps": 500.0, "p99_budget_ms": 2.0, "settings": {},
                      "sut_overhead": {"single-stream": _run(None, 0.081, 0.212, scenario="single-stream"),
                                       "server": _run(500.0, 0.15, 0.9)}}
    return out


def test_traffic_table_shows_each_run_at_the_target_rate(report):
    head, rows = traffic_table(as_report(report))
    cells = {row[0]: dict(zip(head, row)) for row in rows}
    assert list(cells) == ["fp32", "int8"]  # the artifact without traffic has no row
    fp32, int8 = cells["fp32"], cells["int8"]
    assert fp32["p99 ms [CI]"] == "12.500 [11.000, 14.250]" and fp32["steady state"] == "—"
    assert fp32["LoadGen verdict"] == "INVALID: Reduce target QPS to improve latency"
    assert fp32["sustainable"] == NOT_KEPT_UP and fp32["sustainable"].startswith("not sustainable")
    assert (fp32["queue mean ms"], fp32["model mean ms"]) == ("9.500", "0.750")
    assert fp32["within p99 budget"] == "no"
    assert int8["LoadGen verdict"] == "VALID" and int8["sustainable"] == "yes"
    assert (int8["offered /s"], int8["completed /s"], int8["p50 ms"]) == ("500.0", "500.0", "0.610")
    assert int8["mean batch"] == "2.25" and int8["serving"] == "batch ≤8, wait 500 µs, 1 inst × 2 thr"
    assert int8["within p99 budget"] == "yes (95% sure)"


def test_capacity_table_marks_the_best_configuration_and_says_why_a_config_has_none(report):
    head, rows = capacity_table(as_report(report))
    cells = {row[1]: dict(zip(head, row)) for row in rows}
    assert list(cells) == ["b1", "b8 ★", "b8x2"] and {row[0] for row in rows} == {"int8"}
    b1, b8, b8x2 = cells["b1"], cells["b8 ★"], cells["b8x2"]
    assert b1["capacity /s [sure, possible]"] == "400.0 [200.0, 400.0]"
    assert b1["last pass / first fail /s"] == "400.0 / 600.0"
    assert b1["offline /s"] == "610.0" and b1["batching gain [range]"] == "1 (reference)"
    assert b8["capacity /s [sure, possible]"] == "1,000.0 [800.0, —]" and b8["offline /s"] == "1,234.5"
    assert b8["batching gain [range]"] == "2.50× [1.90, —] over b1"
    assert b8["last pass / first fail /s"] == "1,000.0 / none failed" and "may be higher" in b8["note"]
    assert b8x2["capacity /s [sure, possible]"] == "not sustainable" and b8x2["offline /s"] == "—"
    assert b8x2["note"] == f"not sustainable even at 200.0/s: {NOT_KEPT_UP}"


def test_capacity_without_a_best_configuration_still_states_the_batching_gain(report):
    sweep = report["artifacts"][1]["traffic"]["sweep"]
    sweep["best"] = None
    rows = capacity_table(as_report(report))[1]
    assert not any("★" in row[1] for row in rows)
    assert rows[-1][1] == "batching gain" and rows[-1][7] == "2.50× [1.90, —] over b1"


def test_capacity_text_names_the_reason_when_nothing_is_within_budget():
    none = _cap(None, [None, None], [None, 200.0], "none within budget: p99 5.000 ms > 2 ms even at the lowest "
                                                   "probed rate, 200.0/s")
    assert capacity_text(Capacity.model_validate(none)) == "none within budget"
    assert capacity_text(None) == "—"


def test_overhead_line_gives_the_null_models_figures(report):
    assert overhead_line(as_report(report)) == (
        "Harness overhead: the same serving loop around a model that does nothing measures "
        "p50 0.081 ms, p99 0.212 ms single-stream; p50 0.150 ms, p99 0.900 ms in the server scenario at 500.0/s. "
        "That is the harness's own share of every latency above.")
    report["traffic"]["sut_overhead"]["server"] = None
    assert overhead_line(as_report(report)).count("p50") == 1 and "server" not in overhead_line(as_report(report))
    report["traffic"]["sut_overhead"] = None
    assert overhead_line(as_report(report)) is None


def test_sections_end_with_the_traffic_tables(report):
    titles = [title for title, _ in report_tables.sections(as_report(report))]
    assert titles[-2:] == [TRAFFIC_TITLE, CAPACITY_TITLE]


def test_latency_load_curve_draws_one_panel_per_swept_artifact(report, monkeypatch):
    drawn = []
    monkeypatch.setattr(plots, "to_png", lambda fig: drawn.append(fig) or b"png")
    assert plots.latency_load_curve(as_report(report).artifacts, 2.0) == b"png"
    axes = [ax for ax in drawn[0].axes if ax.get_visible()]
    assert len(axes) == 1 and axes[0].get_title().startswith("int8:")
    lines = axes[0].get_lines()
    verticals = {line.get_xdata()[0] for line in lines if line.get_linestyle() == "--"}
    assert {400.0, 1000.0} <= verticals  # the capacities (b8x2 has none)
    assert any(line.get_ydata()[0] == 2.0 and line.get_xdata()[0] == 0 for line in lines)  # the budget
    hollow = [(line.get_xdata()[0], line.get_ydata()[0]) for line in lines
              if line.get_marker() == "o" and line.get_markerfacecolor() == "none" and len(line.get_xdata())]
    assert sorted(hollow) == [(200.0, 5.0), (600.0, 9.0)]  # the saturated points
    labels = axes[0].get_legend_handles_labels()[1]
    assert "b8 ★ p99" in labels and "saturation (not sustainable, or unknown)" in labels


def test_latency_load_curve_is_none_without_a_curve(report):
    assert plots.latency_load_curve(as_report(_plain_report()).artifacts, 2.0) is None
    for config in report["artifacts"][1]["traffic"]["sweep"]["configs"]:
        config["curve"] = [_run(300.0, 1.0, 2.0) | {"latency_ms": None}]
    assert plots.latency_load_curve(as_report(report).artifacts, 2.0) is None


def test_rendered_report_shows_the_traffic_section_overhead_and_curve(report):
    markdown = render_markdown(as_report(report))
    lines = markdown.splitlines()
    at = lines.index(f"## {TRAFFIC_TITLE}")
    table_end = next(i for i in range(at + 2, len(lines)) if not lines[i].startswith("|"))
    assert lines[table_end + 1] == overhead_line(as_report(report))  # under the table
    assert f"## {CAPACITY_TITLE}" in markdown and "| int8 | b8 ★ |" in markdown
    assert "INVALID: Reduce target QPS to improve latency" in markdown
    figs = figures(as_report(report), {})
    assert "latency_vs_load.png" in figs and figs["latency_vs_load.png"].startswith(b"\x89PNG")
    page = render_html(as_report(report), figs)
    assert f"<h2>{TRAFFIC_TITLE}</h2>" in page and '<img alt="latency_vs_load.png"' in page
    assert "harness&#x27;s own share" in page and "<td>b8 ★</td>" in page
    # every table in its own scroll box (the 16-column traffic table scrolls there, never the page); one main table
    assert page.count("<table") == page.count('<div class="scroll"><table') > 1
    assert page.count('<table class="main">') == 1 and "div.scroll {{" not in page and "div.scroll {" in page


def test_a_report_without_traffic_renders_as_before(report):
    plain = _plain_report()
    assert traffic_sections(as_report(plain)) == [] and overhead_line(as_report(plain)) is None
    assert [title for title, _ in report_tables.sections(as_report(plain))] == []
    markdown = render_markdown(as_report(plain))
    assert "traffic" not in markdown.lower() and "capacity" not in markdown.lower()
    figs = figures(as_report(plain), {})
    assert list(figs) == ["accuracy_vs_p99.png", "size_by_artifact.png"]
    assert render_html(as_report(plain), figs).count("<img") == 2
    # traffic keys that hold nothing change nothing either
    empty = copy.deepcopy(plain)
    empty["traffic"] = {"scenario": "server", "target_qps": None, "p99_budget_ms": None, "sut_overhead": None}
    for art in empty["artifacts"]:
        art["traffic"] = {"scenario": "server", "target_qps": None, "at_target": None, "sweep": None}
    empty["artifacts"][0]["traffic"] = None
    assert render_markdown(as_report(empty)) == markdown and render_html(as_report(empty), figs) == render_html(as_report(plain), figs)


def test_partial_runs_render_with_dashes():
    partial = _plain_report()
    bare = {"scenario": "single-stream", "offered_qps": None, "completed_qps": None, "queries": 0, "wall_s": 0.0,
            "latency_ms": None, "p99_ci": None, "loadgen": None, "queue_ms": None, "compute_ms": None,
            "mean_batch": None, "serving": None, "within_budget": None}
    partial["artifacts"][0]["traffic"] = {"scenario": "single-stream", "at_target": bare,
                                          "sweep": {"configs": [{"label": "b1", "serving": None, "offline": None,
                                                                 "curve": [], "capacity": None}],
                                                    "best": None, "batching_gain": None}}
    head, rows = traffic_table(as_report(partial))
    assert rows == [["fp32", "single-stream"] + ["—"] * 14]
    assert capacity_table(as_report(partial))[1] == [["fp32", "b1", "—", "—", "—", "—", "—", "", "no capacity recorded"]]
    assert "## " + TRAFFIC_TITLE in render_markdown(as_report(partial))


def test_accuracy_vs_p99_reads_at_a_glance_on_a_log_axis_with_names_in_the_legend():
    """A baseline ten times slower than the rest: on a log axis every file keeps its own spread; the names are in
    the legend (none written beside a point, so none can overlap), the red line and the budget drawn as lines."""
    plain = _plain_report()
    for art, p99 in zip(plain["artifacts"], (30.0, 0.40, 0.42)):
        art["latency_ms"] = {**art["latency_ms"], "p99": p99}
    fig = plots.accuracy_vs_p99_figure(as_report(plain).artifacts, "top1", 97.5, 2.0)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and not ax.texts
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert {"fp32", "int8", "onnx"} == {text.split("  (")[0] for text in legend if "  (" in text}
    assert "accuracy red line 97.50%" in legend and "p99 budget 2 ms" in legend
    colours = {tuple(line.get_color()) if not isinstance(line.get_color(), str) else line.get_color()
               for line in ax.lines if line.get_marker() not in (None, "None", "")}
    assert len(colours) >= 3  # one colour per file
    plt.close(fig)


def test_rounds_show_their_spread_the_paired_ratio_and_a_drift_flag_naming_the_file(report):
    """A run in rounds shows its rounds' p99s beside the interval and its p99 over the baseline's at the same rate;
    rounds that differ more than their busy periods allow (a permutation test, p < 0.01) say "drifted" and raise a flag
    naming the file and rate; rounds that do not, neither."""
    from serve_bench.report.traffic import drift_flags

    int8 = report["artifacts"][1]["traffic"]["at_target"]
    int8["steady_state"] = {"point": 1.5, "ci": [1.25, 1.75], "rounds": 6, "round_p99": [1.1, 2.9],
                            "rounds_differ_p": 0.0004, "precise": True, "level": 0.99, "queries": 6000,
                            "discarded": 10, "tail_cycles": 40}
    int8["paired"] = {"baseline": {"reference": "fp32", "ratio": 0.12, "ci": [0.1, 0.15], "rounds": 6,
                                   "verdict": "faster", "level": 0.99}}
    parsed = as_report(report)
    head, rows = traffic_table(parsed)
    cells = {row[0]: dict(zip(head, row)) for row in rows}
    assert cells["int8"]["rounds: p99 min–max"] == "1.100–2.900 (6 rounds) drifted"
    assert cells["int8"]["p99 ratio, paired by round [CI]"] == "×0.12 [0.10, 0.15] 99% over baseline (6 rounds)"
    assert cells["fp32"]["rounds: p99 min–max"] == "—"
    (flag,) = drift_flags(parsed.artifacts)
    assert "differ more than their busy periods allow for int8 at 500.0/s (6 rounds, p99 per round 1.100–2.900 ms" in flag
    int8["steady_state"]["rounds_differ_p"] = 0.2
    assert drift_flags(as_report(report).artifacts) == []
    assert "drifted" not in traffic_table(as_report(report))[1][1][7]


def test_an_older_reports_environment_line_still_names_torch_and_onnxruntime():
    """A report written before each runtime's facts were recorded apart: torch's version comes from its packages,
    onnxruntime's from the key it had then."""
    from serve_bench.report.files import environment_line

    old = {"cpu": "Some CPU", "cpu_count": 2, "isa_summary": "AVX2", "packages": {"torch": "2.9.0"},
           "onnxruntime": {"version": "1.20.0", "providers": ["CPUExecutionProvider"]}}
    line = environment_line(old)
    assert "torch 2.9.0; onnxruntime 1.20.0 (CPUExecutionProvider)" in line and "not recorded" not in line
