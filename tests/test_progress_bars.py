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


def test_the_eta_shows_after_one_slow_update_from_the_rate_since_start():
    """A search trial takes minutes: rich's own column (speed from the last 30 s) would show no ETA at all; on a
    fake clock, one trial of four done after 60 s leaves 3 minutes, and 2 of 4 after 200 s leaves 200 s."""
    import io

    from rich.console import Console
    from rich.progress import Progress

    from train.progress import _eta_since_start_column

    now = [0.0]
    column = _eta_since_start_column()
    progress = Progress(column, console=Console(file=io.StringIO()), get_time=lambda: now[0], auto_refresh=False)
    task_id = progress.add_task("search trials", total=4)
    task = progress.tasks[0]
    assert column.render(task).plain == "-:--:--"  # nothing done yet: no rate to project
    now[0] = 60.0
    progress.update(task_id, completed=1)
    assert column.render(task).plain == "0:03:00"
    now[0] = 200.0
    progress.update(task_id, completed=2)
    assert column.render(task).plain == "0:03:20"
    # a resumed search: 10 of 20 trials were done by an earlier process; one new trial in 300 s leaves 9 × 300 s
    now[0] = 0.0
    resumed = progress.add_task("search trials", total=20, completed=10, initial=10)
    task = next(t for t in progress.tasks if t.id == resumed)
    assert column.render(task).plain == "-:--:--"
    now[0] = 300.0
    progress.update(resumed, completed=11)
    assert column.render(task).plain == "0:45:00"


def test_the_traffic_bar_counts_every_test_a_measurement_can_run():
    """Two files at the target rate (server) and one load each, in 5 rounds at least, and a sweep of one of them
    over two configurations: per configuration an offline ceiling, three rates, one bisection probe and the
    confirmation. A single-stream test at the target is one test, not in rounds."""
    settings = TrafficSettings(sweep=True, rates=[0.25, 0.5, 0.85], refine=1, confirm=True, loads=[100.0],
                               sweep_artifacts=["a"], configs=[ServingSettings(), ServingSettings(max_batch=8)])
    assert planned_tests(["a", "b"], "server", settings) == 2 * (1 + 1) * 5 + 2 * 1 * (1 + 3 + 1 + 1)
    assert planned_tests(["a", "b"], "single-stream", TrafficSettings(loadgen=False)) == 0
    assert planned_tests(["a", "b"], "single-stream", TrafficSettings(loadgen=True, loads=[100.0])) == 2 * (1 + 5)
