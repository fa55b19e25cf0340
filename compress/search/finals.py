"""The end of a search: the finalists (chosen on the validation split) measured with the hand-set result
and the baseline in one interleaved bench on the test split, the final gate over the finalists with its
correction for choosing among them, the chosen configuration written out as a plain pipeline file, and
the search report.

Every entry of that bench is a ``Contender`` (its role, its run, its artifact, its trial number): the
search finds a trial's entry by that identity, never by parsing the entry's name.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from compress.search.contenders import HAND_SET, TRIAL, Contender
from compress.search.final_gate import judge_finalists
from compress.search.objective import best_first, listed
from compress.search.search_report import REPORT_DIR, write_search_report
from compress.search.split_bench import entry_of, measure_split, read_split_report, still_stands
from serve_bench.gate import evaluate
from serve_bench.report_model import Entry
from serve_bench.stats.latency_intervals import paired_ratio
from serve_bench.report.files import load_blocked
from train.atomic_io import atomic_write_text

CHOSEN_FILE = "chosen.yaml"


@dataclass
class SearchResult:
    report: dict
    chosen: dict | None  # the chosen trial (number, params, pipeline file) where one passed the final gate


def ranked(study, objective: str) -> list:
    """Measured trials within the limits on the validation split, best first (the objective, then the other
    figure); of trials whose candidates are the same file (a setting that changed nothing), only the best."""
    measured = {t.number: t for t in study.trials if t.user_attrs.get("status") == "feasible"}
    order = best_first([(n, t.user_attrs["outcome"]) for n, t in measured.items()], objective)
    return [measured[n] for n in order]


def _entry_summary(entry: Entry) -> dict:
    """An entry of the final bench as the search's record keeps it (its intervals and ratios as written)."""
    lat, paired = entry.latency_ms, entry.accuracy_paired
    ratio = entry.latency_ratio
    return {"name": entry.name, "contender": entry.contender, "run": entry.run,
            "artifact": entry.run_artifact, "macs": entry.macs, "size_bytes": entry.size_bytes,
            "accuracy": entry.accuracy, "accuracy_ci": {k: listed(v) for k, v in entry.accuracy_ci.items()},
            "drop": entry.accuracy_drop, "drop_ci": listed(paired.drop_ci if paired is not None else None),
            "p50": lat.p50, "p50_ci": listed(lat.p50_ci_blocks), "p99": lat.p99,
            "p99_ci": listed(lat.p99_ci_blocks),
            "latency_ratio": ratio.model_dump(mode="json", exclude_unset=True) if ratio is not None else None}


def contenders_for(search, best: list, reference: dict) -> list[Contender]:
    """The baseline, the hand-set result and every finalist, each from its own run directory."""
    ref_dir = str(search.dir / "reference")
    baseline = Contender.from_dict(read_split_report(Path(reference["report"])).reference_entry().contender)
    hand_set = reference["outcome"]
    return [baseline, Contender(HAND_SET, hand_set["candidate"], ref_dir, runtime=hand_set.get("runtime"))] + [
        Contender(TRIAL, t.user_attrs["outcome"]["candidate"], str(search.dir / t.user_attrs["dir"]), trial=t.number,
                  runtime=t.user_attrs["outcome"].get("runtime"))
        for t in best]


def final_bench(search, best: list, reference: dict) -> dict:
    """One interleaved measurement on the test split of the baseline, the hand-set result and every finalist,
    and the final gate over the finalists."""
    contenders = contenders_for(search, best, reference)
    out = search.dir / time.strftime("final-%Y%m%d-%H%M%S")
    limits = search.limits
    report = measure_split(contenders, search.plan.base, limits, "test", out)
    hand_set = entry_of(report, contenders[1])
    finalists = [entry_of(report, c) for c in contenders[2:]]
    meaningful = report.data.meaningful_accuracy
    latencies = load_blocked(out)
    decided = judge_finalists(finalists, limits, meaningful, latencies, search.settings.objective)
    hand_set_gate = evaluate([hand_set], limits, accuracy_meaningful=meaningful)
    chosen = next((Contender.from_dict(e.contender) for e in finalists if e.name == decided["release"]), None)
    result = {"folder": out.name, "split": "test", "limits": limits.as_dict(), "decision": limits.decision,
              "max_drop": limits.max_drop, "p99_budget_ms": limits.p99_budget_ms, "metric": limits.metric,
              "finalists": [t.number for t in best], "contenders": [c.as_dict() for c in contenders],
              "entries": [_entry_summary(e) for e in report.artifacts], "gate": decided,
              "hand_set_passes": hand_set_gate["passed"], "chosen": chosen.as_dict() if chosen else None,
              "flags": list(report.flags)}
    if chosen is not None:
        result["chosen_vs_hand_set"] = {
            q: paired_ratio(latencies[chosen.name], latencies[hand_set.name], p).as_dict()
            for q, p in (("p50", 50.0), ("p99", 99.0))}
    return result


def write_chosen(search, trial, final: dict) -> Path:
    """The chosen configuration as a plain pipeline file: the hand-set one with the trial's settings."""
    raw = search.plan.trial_raw(trial.params)
    raw["name"] = f"{search.settings.name}-chosen"
    vs = (final.get("chosen_vs_hand_set") or {}).get("p99")
    lines = [f"# Chosen by `compress search {search.plan.path}`: trial {trial.number}, "
             f"{final['chosen']['artifact']} in {search.dir / final['folder']}.",
             f"# It is {search.plan.base_path} with: " + ", ".join(f"{k}={v!r}" for k, v in trial.params.items()) + ".",
             f"# `threads: {raw['threads']}` is the thread count its weights were trained with: the same count "
             "gives the same bits.",
             f"# Reproduce: compress run {search.dir / CHOSEN_FILE}"]
    if vs:
        lines.insert(2, "# p99 against the hand-set pipeline's result in one interleaved bench: "
                        f"×{vs['ratio']:.3f} [{vs['ci'][0]:.3f}, {vs['ci'][1]:.3f}] ({vs['verdict']}).")
    path = search.dir / CHOSEN_FILE
    atomic_write_text(path, "\n".join(lines) + "\n" + yaml.safe_dump(raw, sort_keys=False))
    return path


def measured_before(search, best: list, reference: dict) -> dict | None:
    """The last final bench, where it measured these same finalists under the same limits, and its report still
    stands for the files, bench settings, images and machine of now: a finished search run again reports it
    rather than measuring (and choosing) anew; edited limits, a re-made file or other settings measure anew."""
    path = search.dir / REPORT_DIR / "search.json"
    try:
        final = json.loads(path.read_text()).get("final")
    except (OSError, ValueError):
        return None
    if not final or not (search.dir / final["folder"]).is_dir():
        return None
    same = final.get("finalists") == [t.number for t in best] and final.get("limits") == search.limits.as_dict()
    if not same or not still_stands(contenders_for(search, best, reference), search.plan.base, search.limits, "test",
                                    search.dir / final["folder"]):
        return None
    return final


def finish(search, study, optuna, reference: dict) -> SearchResult:
    best = ranked(study, search.settings.objective)[: search.settings.finalists]
    final, chosen = None, None
    if best:
        final = measured_before(search, best, reference)
        if final is not None:
            search.say(f"the finalists ({', '.join(f'trial {t.number}' for t in best)}) were measured together "
                       f"before, in {search.dir / final['folder']}: that bench stands")
        else:
            search.say(f"finalists (on the validation split): {', '.join(f'trial {t.number}' for t in best)}, with "
                       "the hand-set result and the baseline, in one interleaved bench on the test split")
            final = final_bench(search, best, reference)
        if final["chosen"]:
            number = final["chosen"]["trial"]
            trial = next(t for t in best if t.number == number)
            chosen = {"trial": number, "params": trial.params, "artifact": final["chosen"]["artifact"],
                      "dir": trial.user_attrs["dir"], "pipeline": str(write_chosen(search, trial, final))}
    else:
        search.say("no trial was within the limits on the validation split: nothing to measure on the test split",
                   "yellow")
    report = write_search_report(search, study, optuna, reference, final, chosen)
    return SearchResult(report=report, chosen=chosen)
