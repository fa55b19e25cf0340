"""Progress bars with an ETA for the steps that take a while: drawn on a terminal, nothing elsewhere; and the
traffic bar's total, the most LoadGen tests a measurement runs."""
from __future__ import annotations

from serve_bench.latency.traffic import TrafficSettings, planned_tests
from serve_bench.load.serving_loop import ServingSettings


def test_the_bar_draws_on_a_terminal_only():
    import io

    from train.progress import LiveBar

    quiet = io.StringIO()  # not a terminal: a log file, CI
    with LiveBar("measuring 2 files", 100, stream=quiet) as bar:
        bar.update(50)
    assert quiet.getvalue() == "" and not bar.live
    shown = io.StringIO()
    with LiveBar("measuring 2 files", 100, stream=shown, live=True) as bar:
        bar.update(50)
    assert "measuring 2 files" in shown.getvalue()


def test_the_traffic_bar_counts_every_test_a_measurement_can_run():
    """Two files at the target rate (server), one load each, and a sweep of one of them over two configurations:
    per configuration an offline ceiling, three rates, one bisection probe and the confirmation."""
    settings = TrafficSettings(sweep=True, rates=[0.25, 0.5, 0.85], refine=1, confirm=True, loads=[100.0],
                               sweep_artifacts=["a"], configs=[ServingSettings(), ServingSettings(max_batch=8)])
    assert planned_tests(["a", "b"], "server", settings) == 2 * (1 + 1) + 2 * 1 * (1 + 3 + 1 + 1)
    assert planned_tests(["a", "b"], "single-stream", TrafficSettings(loadgen=False)) == 0
