"""A measurement inside the search runs in the environment a plain run's measurement has.

Ray starts its workers at niceness 15 and sets OMP_NUM_THREADS to the task's CPUs; a bench worker
process spawned there inherited both. The checks compare what a process spawned the way the bench
spawns its workers sees (thread variables, torch's default thread count, niceness, CPU affinity)
inside the measure phase and outside it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from compress.search.measure_env import (MeasurementEnvironment, MeasurementEnvironmentError, environment_probe,
                                          measured_as, spawned_environment)
from tests.conftest import ROOT

RAY_LIKE = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # what a Ray task holding one CPU has


def _spec(environment: dict) -> dict:
    return {"label": "0", "run_dir": ".", "raw": {}, "source": "p.yaml", "reference": None, "shared": [],
            "early_stop_after": None, "hopeless_margin": 3.0, "limits": {}, "environment": environment, "number": 0}


def _in_a_ray_like_worker(environment: dict) -> subprocess.CompletedProcess:
    """The measure phase's environment probe in a process started the way a Ray worker is: niced, with the
    thread variables of a one-CPU task."""
    code = ("import json, sys\nfrom compress.search.measure_env import environment_probe\n"
            "print(json.dumps(environment_probe(json.loads(sys.argv[1]))))")
    env = {**os.environ, **RAY_LIKE, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run([sys.executable, "-c", code, json.dumps(_spec(environment))], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, preexec_fn=lambda: os.nice(15))


def test_the_measure_phase_gives_a_spawned_worker_the_environment_of_the_searchs_process():
    outside = spawned_environment()
    here = MeasurementEnvironment.here()
    result = _in_a_ray_like_worker(here.as_dict())
    if os.geteuid() != 0 and here.niceness < 15:  # an unprivileged process may not raise its priority back
        assert result.returncode != 0 and "RAY_worker_niceness=0" in result.stderr
        return
    assert result.returncode == 0, result.stderr[-2000:]
    inside = json.loads(result.stdout.strip().splitlines()[-1])
    assert inside == outside
    assert inside["variables"]["OMP_NUM_THREADS"] == os.environ.get("OMP_NUM_THREADS")  # not the task's "1"


def test_the_environment_is_put_back_after_the_measurement_and_an_impossible_one_is_refused(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    wanted = MeasurementEnvironment.here()
    wanted = MeasurementEnvironment({**wanted.variables, "OMP_NUM_THREADS": None, "MKL_NUM_THREADS": "3"},
                                    wanted.niceness, wanted.cpus)
    with measured_as(wanted) as reached:
        assert os.environ.get("OMP_NUM_THREADS") is None and os.environ["MKL_NUM_THREADS"] == "3"
        assert reached == wanted.on_this_machine()
    assert os.environ["OMP_NUM_THREADS"] == "7" and "MKL_NUM_THREADS" not in os.environ
    impossible = MeasurementEnvironment(wanted.variables, -20, wanted.cpus)
    if os.geteuid() != 0:
        with pytest.raises(MeasurementEnvironmentError, match="may not raise its priority"):
            with measured_as(impossible):
                pass
    # a search process on another machine: its affinity is not this machine's, so every CPU here is wanted
    elsewhere = MeasurementEnvironment(wanted.variables, wanted.niceness, (0, 10_000))
    assert elsewhere.on_this_machine().cpus == tuple(range(os.cpu_count() or 1))


@pytest.mark.slow  # starts a Ray instance (10-20 s on 2 cores)
def test_a_measurement_on_the_searchs_ray_has_the_environment_of_a_plain_run(tmp_path):
    """The search's own Ray instance and its measure task, end to end: a process spawned in that task sees
    what one spawned by a plain run sees."""
    pytest.importorskip("ray")
    pytest.importorskip("optuna")
    from rich.console import Console

    from compress.search.driver import Search
    from compress.search.settings import load_search
    from tests.test_search_plan import _write

    path = _write(tmp_path, {"space": {"stages.prune.target.macs": [0.3, 0.5]}, "parallel": 1})
    search = Search(load_search(path), Console(file=open(tmp_path / "log.txt", "w")), tmp_path / "s")
    outside = spawned_environment()
    search._start_ray()
    try:
        spec = search._spec("0", tmp_path / "s" / "trials" / "000", {}, 0)
        inside = search._ray.get(search.measure_task(environment_probe).remote(spec.as_dict()))
    finally:
        search._ray.shutdown()
    assert inside == outside
