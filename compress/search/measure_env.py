"""The environment a latency measurement runs in, carried from the search's own process into the Ray
task that measures, so a trial is measured as a plain `compress run` would measure it.

A Ray worker is not a plain process: the raylet starts it at niceness 15 (its `worker_niceness`
default) and sets OMP_NUM_THREADS to the CPUs the task holds, and the bench's worker processes
inherit both. At niceness 15 every other runnable thread of the machine, Ray's own daemons
included, goes first: the same files measured inside the search read slower than outside it.
So the search starts its local Ray with worker niceness 0, and each measurement task puts back
the thread variables, niceness and CPU affinity of the process that started the search before
it spawns a worker; where it cannot (raising priority needs privileges a Ray cluster's worker
may lack) it refuses rather than measure at a lower priority than a plain run.
"""
from __future__ import annotations

import multiprocessing as mp
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

from compress.errors import StageError

# What threading libraries read at start-up: OpenMP (torch's intra-op pool), MKL, OpenBLAS, numexpr,
# and the spin/affinity knobs of the OpenMP runtimes.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS",
                    "VECLIB_MAXIMUM_THREADS", "OMP_WAIT_POLICY", "OMP_PROC_BIND", "OMP_PLACES", "GOMP_SPINCOUNT",
                    "GOMP_CPU_AFFINITY", "KMP_AFFINITY", "KMP_BLOCKTIME")
RAY_NICENESS = {"worker_niceness": 0}  # the local Ray instance's system config: workers at a plain process's priority


class MeasurementEnvironmentError(StageError):
    """A measurement would run in another environment than a plain run's and it cannot be put back."""


@dataclass(frozen=True)
class MeasurementEnvironment:
    variables: dict[str, str | None] = field(default_factory=dict)  # each of THREAD_VARIABLES, None where unset
    niceness: int = 0
    cpus: tuple[int, ...] = ()  # the CPU affinity

    @classmethod
    def here(cls) -> "MeasurementEnvironment":
        """This process's, as a worker process it spawns would inherit it."""
        return cls(variables={k: os.environ.get(k) for k in THREAD_VARIABLES}, niceness=os.nice(0),
                   cpus=tuple(sorted(os.sched_getaffinity(0))))

    def as_dict(self) -> dict:
        return {"variables": dict(self.variables), "niceness": self.niceness, "cpus": list(self.cpus)}

    @classmethod
    def from_dict(cls, data: dict) -> "MeasurementEnvironment":
        return cls(variables=dict(data["variables"]), niceness=int(data["niceness"]), cpus=tuple(data["cpus"]))

    def on_this_machine(self) -> "MeasurementEnvironment":
        """The same, with the affinity this machine can give: where the search's process ran on another
        machine (a Ray cluster), a plain run here would have every CPU of this one."""
        available = tuple(range(os.cpu_count() or 1))
        cpus = self.cpus if self.cpus and set(self.cpus) <= set(available) else available
        return MeasurementEnvironment(dict(self.variables), self.niceness, cpus)

    def differences(self, other: "MeasurementEnvironment") -> list[str]:
        """What ``other`` has that this one has not, in words (empty: the same)."""
        out = [f"{k}={other.variables.get(k)!r} (wanted {v!r})" for k, v in self.variables.items()
               if other.variables.get(k) != v]
        if other.niceness != self.niceness:
            out.append(f"niceness {other.niceness} (wanted {self.niceness})")
        if other.cpus != self.cpus:
            out.append(f"CPU affinity {list(other.cpus)} (wanted {list(self.cpus)})")
        return out


def _apply(wanted: MeasurementEnvironment) -> None:
    for key, value in wanted.variables.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    now = os.nice(0)
    if now != wanted.niceness:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, wanted.niceness)
        except OSError as exc:
            raise MeasurementEnvironmentError(
                f"the measurement task runs at niceness {now} where the search's process has {wanted.niceness}, and "
                f"it may not raise its priority ({exc.strerror}): its figures would read slower than a plain run's. "
                "Start Ray on the bench machine with its workers at niceness 0 (RAY_worker_niceness=0 ray start ...), "
                "or run the search without `ray.address` (its own Ray instance does this)") from exc
    if tuple(sorted(os.sched_getaffinity(0))) != wanted.cpus:
        os.sched_setaffinity(0, wanted.cpus)


@contextmanager
def measured_as(wanted: MeasurementEnvironment) -> Iterator[MeasurementEnvironment]:
    """This process in ``wanted``'s environment for the block (the thread variables put back after it; a Ray
    worker serves other tasks next); yields the environment it reached, which equals ``wanted``."""
    before = {k: os.environ.get(k) for k in THREAD_VARIABLES}
    wanted = wanted.on_this_machine()
    try:
        _apply(wanted)
        reached = MeasurementEnvironment.here()
        left = wanted.differences(reached)
        if left:
            raise MeasurementEnvironmentError("the measurement task could not take the search process's "
                                              f"environment: {'; '.join(left)}")
        yield reached
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _report_facts(queue) -> None:
    import torch

    queue.put({**MeasurementEnvironment.here().as_dict(), "torch_threads": torch.get_num_threads()})


def spawned_environment() -> dict:
    """What a process spawned the way the bench spawns each artifact's worker sees: its environment and
    torch's default thread count."""
    context = mp.get_context("spawn")  # as serve_bench.latency.worker starts its processes
    queue = context.Queue()
    child = context.Process(target=_report_facts, args=(queue,))
    child.start()
    facts = queue.get(timeout=120)
    child.join(timeout=30)
    return facts


def environment_probe(spec: dict) -> dict:
    """In a measure phase's environment (a trial spec's ``environment``), what a bench worker would see."""
    with measured_as(MeasurementEnvironment.from_dict(spec["environment"])):
        return spawned_environment()
