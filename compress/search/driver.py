"""`compress search`: trials proposed by Optuna, built in parallel on Ray, measured one at a time,
the finalists re-measured together against the hand-set pipeline.

The order of work, and why:
1. The hand-set pipeline runs as it is (all but its bench stage), into ``reference/``: it trains
   the baseline every trial is judged against and gives the result the search has to beat.
2. Trials are asked from Optuna (ask-and-tell, so the study lives in this process and its
   journal file; Ray workers only run pipelines). Each trial's build phase runs on Ray beside
   others; its measurement waits until no build is running and holds every CPU and the one
   bench resource, because a p99 measured next to a training process measures the neighbour.
   A trial (and the hand-set run) is scored on the **validation** split, beside the reference
   baseline: its drop against that baseline and its p99 as a ratio to it, in the same bench.
3. The finalists (best feasible trials on validation), the hand-set result and the baseline are
   measured again in one interleaved bench on the **test** split, touched there for the first
   time; the final gate corrects for choosing among the finalists on it (final_gate).

Measurements run in the environment of this process (measure_env): Ray starts its workers at
niceness 15 with OMP_NUM_THREADS set to the task's CPUs, and a bench's worker processes inherit
both; the final bench runs here, after Ray is shut down.

The journal in the search directory holds every trial; an interrupted search continues from it
(trials that were running are recorded as interrupted and asked again with the same settings,
into the same directory, where their finished stages are cached).
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from compress.errors import ConfigError, StageError
from compress.pipeline.run_lock import RunLock
from compress.search.finals import SearchResult, finish
from compress.search.measure_env import RAY_NICENESS, MeasurementEnvironment
from compress.search.objective import candidate_name, directions, values
from compress.search.settings import SearchPlan
from compress.search.trial_dirs import shared_stages
from compress.search.trial_phases import TrialSpec, build, measure
from train.progress import LiveBar
from compress.stages.measurement import limits_of
from compress.stages.runtime_choice import onnx_runtimes

JOURNAL = "study.journal"
REFERENCE = "reference"
INTERRUPTED = "interrupted"


def _require(name: str):
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ConfigError(f"compress search needs {name}, which is not installed: pip install -e \".[search]\" "
                          "(adds Optuna and Ray)") from exc


def suggest(trial, space: dict) -> dict[str, Any]:
    """A value per space path from the trial (an enqueued trial gets its stored values back)."""
    params = {}
    for path, spec in space.items():
        if isinstance(spec, list):
            params[path] = trial.suggest_categorical(path, spec)
        elif spec.integer:
            params[path] = trial.suggest_int(path, spec.low, spec.high, step=spec.step or 1, log=spec.log)
        else:
            params[path] = trial.suggest_float(path, spec.low, spec.high, step=spec.step, log=spec.log)
    return params


def _sampler(optuna, plan: SearchPlan):
    s = plan.settings
    if s.sampler == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=s.seed, population_size=s.population or max(4, 2 * s.parallel))
    return optuna.samplers.TPESampler(seed=s.seed, n_startup_trials=s.startup(), constant_liar=True,
                                      multivariate=True)


SCORED_ON = ("validation split, p99 as a ratio to the reference baseline in the same bench, each file on every "
             "runtime the bench measures it on")


def _space_record(plan: SearchPlan) -> str:
    """What a study's stored trials stand for: a search directory holding another one is not continued."""
    return json.dumps({"pipeline": str(plan.base_path), "space": plan.settings.space_dict(),
                       "objective": plan.settings.objective, "sampler": plan.settings.sampler,
                       "threads": plan.settings.threads(), "limits": limits_of(plan.base.config).as_dict(),
                       "latency": plan.base.config.latency.model_dump(mode="json"),
                       "nms": plan.base.config.nms.model_dump(mode="json"),
                       "runtimes": scored_runtimes(plan), "scored_on": SCORED_ON}, sort_keys=True)


def scored_runtimes(plan: SearchPlan) -> list[str]:
    """The runtimes a trial's files are scored on (every usable one where the bench stage names none): a study
    scored on others is not continued."""
    bench = [s for s in plan.base.stages if s.kind == "bench"][-1]
    return onnx_runtimes(bench.runtimes, bench.device, f"stages.{bench.name}.runtimes")


def _record_differences(stored: str, current: str) -> list[str]:
    try:
        old = json.loads(stored)
    except ValueError:
        return ["the stored record is unreadable"]
    new = json.loads(current)
    return [f"{key}: {json.dumps(old.get(key))} there, {json.dumps(new[key])} now" for key in sorted(new)
            if old.get(key) != new[key]]


class Search:
    def __init__(self, plan: SearchPlan, console: Console, run_dir: Path | None = None) -> None:
        self.plan, self.console = plan, console
        self.dir = Path(run_dir or plan.run_dir)
        self.settings = plan.settings
        self.shared = shared_stages(plan.base, list(plan.settings.space))
        self.limits = limits_of(plan.base.config)
        # Captured before Ray starts: what a plain run's measurement would inherit from this process.
        self.environment = MeasurementEnvironment.here()
        self._ray = None
        self._tasks: dict[str, Any] = {}

    # --- output -----------------------------------------------------------------------------
    def say(self, text: str, style: str | None = None) -> None:
        self.console.print(f"[bold]search[/]: {text}" if style is None else f"[bold]search[/]: [{style}]{text}[/]",
                           highlight=False)

    # --- Ray ----------------------------------------------------------------------------------
    def _start_ray(self) -> None:
        ray = _require("ray")
        s = self.settings.ray
        options: dict[str, Any] = {"log_to_driver": False, "configure_logging": False}
        # ray.init installs its own SIGTERM handler (a stack dump and exit 1): the search's own, which records
        # the interruption and says how to continue, is put back.
        on_term = signal.getsignal(signal.SIGTERM)
        if s.address:
            ray.init(address=s.address, **options)
            where = f"the Ray cluster at {s.address}"
        else:
            # Workers at a plain process's priority (Ray's default is niceness 15, which a measurement inherits).
            ray.init(num_cpus=os.cpu_count(), resources={s.bench_resource: 1}, include_dashboard=False,
                     object_store_memory=128 * 2**20, _system_config=dict(RAY_NICENESS), **options)
            where = "a local Ray instance"
        if on_term is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, on_term)
        cpus = s.bench_cpus or os.cpu_count() or 1
        threads = self.settings.threads()
        self._ray = ray
        self._tasks = {"build": ray.remote(num_cpus=threads, max_retries=0)(build), "measure": self.measure_task(measure)}
        self.say(f"on {where}: {self.settings.parallel} trials built at once with {threads} thread"
                 f"{'s' if threads > 1 else ''} each; measurements one at a time on {cpus} CPUs")

    def measure_task(self, function):
        """``function`` as a Ray task holding what a measurement holds: every CPU of the bench machine and its
        one bench resource (the measure phase, and the test that its environment is a plain run's)."""
        s = self.settings.ray
        return self._ray.remote(num_cpus=s.bench_cpus or os.cpu_count() or 1, resources={s.bench_resource: 1},
                                max_retries=0)(function)

    def _call(self, phase: str, spec: TrialSpec):
        return self._tasks[phase].remote(spec.as_dict())

    def _result(self, ref) -> dict:
        try:
            return self._ray.get(ref)
        except Exception as exc:  # noqa: BLE001 - a worker that died (killed, out of memory) fails its trial
            return {"status": "failed", "phase": "worker", "error": f"the Ray worker died: {type(exc).__name__}: "
                                                                    f"{str(exc).splitlines()[0] if str(exc) else ''}"}

    # --- trials -------------------------------------------------------------------------------
    def _spec(self, label: str, run_dir: Path, params: dict, number: int | None = None) -> TrialSpec:
        is_reference = label == REFERENCE
        return TrialSpec(label=label, run_dir=str(run_dir), raw=self.plan.trial_run_raw(params),
                         source=f"{self.plan.base_path}" + ("" if is_reference else f" (trial {label})"),
                         reference=None if is_reference else str(self.dir / REFERENCE),
                         shared=[] if is_reference else self.shared,
                         early_stop_after=self.settings.early_stop_after, hopeless_margin=self.settings.hopeless_margin,
                         limits=self.limits.as_dict(), environment=self.environment.as_dict(), number=number)

    def _reference(self) -> dict:
        """The hand-set pipeline, run as it is: the shared baseline and the result to beat."""
        spec = self._spec(REFERENCE, self.dir / REFERENCE, {})
        self.say(f"reference: {self.plan.base_path} as set by hand, into {spec.run_dir}")
        built = self._result(self._call("build", spec))
        if built["status"] == "built":
            built = self._result(self._call("measure", spec))
        if built["status"] != "measured":
            raise StageError(f"the reference run ({self.plan.base_path}) failed in its {built.get('phase')} phase: "
                             f"{built.get('error')}; its log: {built.get('log')}")
        outcome = built["outcome"]
        if outcome.get("candidate") is None:
            raise ConfigError(f"{self.plan.base_path}: its bench measured nothing but the baseline, so a search has "
                              "nothing to make faster; add the stages that make a deployable artifact (prune, "
                              "quantize, export)")
        self.say(f"reference: {self._describe(outcome)}")
        return built

    def _say_what_trials_share(self) -> None:
        trains = [s.name for s in self.plan.base.stages if s.kind == "train"]
        if trains and trains[0] not in self.shared:
            self.say(f"the space reaches stage {trains[0]!r}: each trial trains its own model there, and every trial "
                     "is still judged against the reference run's baseline", "yellow")

    @staticmethod
    def _describe(o: dict) -> str:
        ci = o.get("p99_ci") or [o["p99"], o["p99"]]
        text = f"{candidate_name(o)} p99 {o['p99']:.3f} ms [{ci[0]:.3f}, {ci[1]:.3f}]"
        if o.get("p99_ratio") is not None:
            rci = o.get("p99_ratio_ci") or [o["p99_ratio"]] * 2
            text += f" (×{o['p99_ratio']:.3f} [{rci[0]:.3f}, {rci[1]:.3f}] of the baseline's)"
        if o.get("carried_qps") is not None:
            text += f", carries {o['carried_qps']:,.1f} queries/s within the budget"
        if o.get("accuracy") is not None and o.get("drop") is not None:
            text += f", validation {o['metric']} {o['accuracy']:.2f}% (drop {o['drop']:+.2f})"
        return text + (", within the limits" if o["feasible"] else f", OUT: {o['why']}")

    def _recover(self, study, optuna) -> None:
        """Trials a killed search left running: recorded as interrupted, asked again into the same folder."""
        interrupted = list(study.user_attrs.get(INTERRUPTED, []))
        for frozen in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            study.tell(frozen.number, state=optuna.trial.TrialState.FAIL)
            interrupted.append(frozen.number)
            study.enqueue_trial(frozen.params, user_attrs={"dir": frozen.user_attrs.get("dir"),
                                                           "retry_of": frozen.number})
            self.say(f"trial {frozen.number} was interrupted: asked again with its settings (its finished stages "
                     "are kept)", "yellow")
        study.set_user_attr(INTERRUPTED, interrupted)

    def _finished(self, study, optuna) -> int:
        done = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL)
        interrupted = set(study.user_attrs.get(INTERRUPTED, []))
        return sum(1 for t in study.get_trials(deepcopy=False, states=done) if t.number not in interrupted)

    def _ask(self, study) -> tuple[Any, TrialSpec]:
        trial = study.ask()
        params = suggest(trial, self.settings.space)
        folder = trial.user_attrs.get("dir") or f"trials/{trial.number:03d}"
        trial.set_user_attr("dir", folder)
        trial.set_user_attr("status", "running")
        return trial, self._spec(str(trial.number), self.dir / folder, params, trial.number)

    def _tell_built(self, study, optuna, trial, result: dict) -> bool:
        """True when the trial goes on to be measured."""
        if result["status"] != "built":
            self._tell_stopped(study, optuna, trial, result)
            return False
        trial.set_user_attr("build_s", result["seconds"])
        self.say(f"trial {trial.number}: built in {result['seconds']:.0f}s; waits for the bench")
        return True

    def _tell_stopped(self, study, optuna, trial, result: dict) -> None:
        """A trial stopped early (pruned) or failed, in either phase."""
        trial.set_user_attr("status", result["status"])
        if result["status"] == "pruned":
            trial.set_user_attr("reason", result["reason"])
            # Infeasible with its miss, relative to the red line: told as a plain PRUNED trial, TPE counts it
            # among the good ones (a pruned trial without intermediate values scores like the best) and copies it.
            trial.set_constraint("drop", round(self.limits.drop_miss(result["drop"]), 4))
            trial.set_constraint("p99", 0.0)  # not measured
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            self.say(f"trial {trial.number}: {result['reason']}", "yellow")
            return
        trial.set_user_attr("error", f"{result.get('phase')}: {result.get('error')}")
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        self.say(f"trial {trial.number} FAILED ({result.get('phase')}): {result.get('error')}; "
                 f"log: {result.get('log')}", "red")

    def _tell_measured(self, study, optuna, trial, result: dict) -> None:
        if result["status"] != "measured":
            self._tell_stopped(study, optuna, trial, result)
            return
        outcome = result["outcome"]
        trial.set_user_attr("measure_s", result["seconds"])
        trial.set_user_attr("outcome", outcome)
        for key, value in zip(("drop", "p99"), outcome["constraints"]):  # relative misses, ≤ 0 within: the samplers read these
            trial.set_constraint(key, value)
        trial.set_user_attr("status", "feasible" if outcome["feasible"] else "over the limits")
        study.tell(trial, values(outcome, self.settings.objective, self.settings.sampler))
        self.say(f"trial {trial.number}: {self._describe(outcome)}", None if outcome["feasible"] else "yellow")

    def _loop(self, study, optuna) -> None:
        s = self.settings
        # an ETA on a terminal (from this process's trials: a resumed study's earlier ones took no time here)
        with LiveBar("search trials", s.trials, initial=self._finished(study, optuna)) as bar:
            self._trials(study, optuna, bar)

    def _trials(self, study, optuna, bar: LiveBar) -> None:
        s = self.settings
        builds: dict[Any, Any] = {}  # object ref → (trial, spec)
        measures: dict[Any, Any] = {}
        while True:
            done = self._finished(study, optuna)
            bar.update(done, note=f"{len(builds)} building, {len(measures)} measuring")
            # A measurement needs the machine to itself: no new build starts while one waits or runs.
            while not measures and len(builds) < s.parallel and done + len(builds) < s.trials:
                trial, spec = self._ask(study)
                self.say(f"trial {trial.number}: {', '.join(f'{k}={v!r}' for k, v in trial.params.items())}")
                builds[self._call("build", spec)] = (trial, spec)
            if not builds and not measures:
                return
            ready, _ = self._ray.wait(list(builds) + list(measures), num_returns=1)
            ref = ready[0]
            if ref in builds:
                trial, spec = builds.pop(ref)
                if self._tell_built(study, optuna, trial, self._result(ref)):
                    measures[self._call("measure", spec)] = (trial, spec)
            else:
                trial, spec = measures.pop(ref)
                self._tell_measured(study, optuna, trial, self._result(ref))

    # --- the whole search ----------------------------------------------------------------------
    def run(self) -> SearchResult:
        optuna = _require("optuna")
        _require("ray")
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.dir.mkdir(parents=True, exist_ok=True)
        with RunLock(self.dir):
            study = self._study(optuna)
            started = time.monotonic()
            self._start_ray()
            try:
                reference = self._reference()
                self._say_what_trials_share()
                self._recover(study, optuna)
                self._loop(study, optuna)
            finally:
                self._ray.shutdown()
            self.say(f"{self._finished(study, optuna)} trials finished ({time.monotonic() - started:.0f}s this "
                     "invocation); the finalists are measured again, together")
            return finish(self, study, optuna, reference)

    def _study(self, optuna):
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        storage = JournalStorage(JournalFileBackend(str(self.dir / JOURNAL)))
        study = optuna.create_study(storage=storage, study_name=self.settings.name, load_if_exists=True,
                                    sampler=_sampler(optuna, self.plan),
                                    directions=directions(self.settings.sampler))
        record = _space_record(self.plan)
        stored = study.user_attrs.get("search")
        if stored is None:
            study.set_user_attr("search", record)
        elif stored != record:
            raise ConfigError(f"{self.dir} holds a search with another space, objective, sampler, thread count, limits "
                              f"or scoring than {self.plan.path} now gives ("
                              + "; ".join(_record_differences(stored, record)) + "): its trials were built and "
                              "judged for those, so continuing would choose under the old ones; pass another "
                              "run_dir (or put the files back as they were to continue it)")
        previous = self._finished(study, optuna)
        if previous:
            self.say(f"continuing {self.dir / JOURNAL}: {previous} of {self.settings.trials} trials finished before")
        return study
