"""The end of a search: the finalists measured again with the hand-set result and the baseline in
one interleaved bench, the statistical gate over the finalists, the chosen configuration written
out as a plain pipeline file, and the search report."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from compress.pipeline.compare import compare_runs
from compress.search.objective import rank_key
from compress.search.search_report import REPORT_DIR, write_search_report
from serve_bench.gate import evaluate
from serve_bench.latency_intervals import paired_ratio
from serve_bench.report import load_blocked
from train.atomic_io import atomic_write_text

BASELINE, HAND_SET = "baseline", "hand-set"
CHOSEN_FILE = "chosen.yaml"


@dataclass
class SearchResult:
    report: dict
    chosen: dict | None  # the chosen trial (number, params, pipeline file) where one passed the final gate


def ranked(study, objective: str) -> list:
    """Measured trials within the limits, best first (the objective, then the other figure); of trials whose
    candidates are the same file (a setting that changed nothing), only the best."""
    feasible = [t for t in study.trials if t.user_attrs.get("status") == "feasible"]
    out, seen = [], set()
    for t in sorted(feasible, key=lambda t: rank_key(t.user_attrs["outcome"], objective)):
        digest = t.user_attrs["outcome"].get("sha256")
        if digest is None or digest not in seen:
            out.append(t)
            seen.add(digest)
    return out


def _entry_summary(entry: dict) -> dict:
    lat, paired = entry["latency_ms"], entry.get("accuracy_paired") or {}
    return {"name": entry["name"], "run": entry.get("run"),
            "artifact": entry.get("run_artifact"), "macs": entry.get("macs"), "size_bytes": entry.get("size_bytes"),
            "accuracy": entry.get("accuracy"), "accuracy_ci": entry.get("accuracy_ci"),
            "drop": entry.get("accuracy_drop"), "drop_ci": paired.get("drop_ci"),
            "p50": lat.get("p50"), "p50_ci": lat.get("p50_ci_blocks"), "p99": lat.get("p99"),
            "p99_ci": lat.get("p99_ci_blocks"), "latency_ratio": entry.get("latency_ratio")}


def final_bench(search, best: list, reference: dict) -> dict:
    """One interleaved measurement of the baseline, the hand-set result and every finalist."""
    ref_dir = search.dir / "reference"
    ref_report = json.loads(Path(reference["report"]).read_text())
    out = search.dir / time.strftime("final-%Y%m%d-%H%M%S")
    labels = [BASELINE, HAND_SET] + [f"trial-{t.number}" for t in best]
    picks = [ref_report["baseline"], reference["outcome"]["candidate"]] + \
        [t.user_attrs["outcome"]["candidate"] for t in best]
    run_dirs = [ref_dir, ref_dir] + [search.dir / t.user_attrs["dir"] for t in best]
    report = compare_runs(run_dirs, out, search.console, picks=picks, labels=labels)
    entries = report["artifacts"]
    finalists = [e for e in entries if e["name"].startswith("trial-")]
    hand_set = next(e for e in entries if e["name"].startswith(f"{HAND_SET}:"))
    gate = report["gate"]
    meaningful = (report.get("data") or {}).get("meaningful_accuracy", True)
    decided = evaluate(finalists, gate["p99_budget_ms"], gate["max_accuracy_drop"], accuracy_meaningful=meaningful,
                       decision=gate["decision"])
    hand_set_gate = evaluate([hand_set], gate["p99_budget_ms"], gate["max_accuracy_drop"],
                             accuracy_meaningful=meaningful, decision=gate["decision"])
    result = {"folder": out.name, "decision": gate["decision"], "max_drop": gate["max_accuracy_drop"],
              "p99_budget_ms": gate["p99_budget_ms"], "entries": [_entry_summary(e) for e in entries],
              "gate": decided, "hand_set_passes": hand_set_gate["passed"], "chosen": decided["release"],
              "flags": report.get("flags", [])}
    if decided["release"]:
        latencies = load_blocked(out)
        result["chosen_vs_hand_set"] = {
            q: paired_ratio(latencies[decided["release"]], latencies[hand_set["name"]], p).as_dict()
            for q, p in (("p50", 50.0), ("p99", 99.0))}
    return result


def write_chosen(search, trial, final: dict) -> Path:
    """The chosen configuration as a plain pipeline file: the hand-set one with the trial's settings."""
    raw = search.plan.trial_raw(trial.params)
    raw["name"] = f"{search.settings.name}-chosen"
    vs = (final.get("chosen_vs_hand_set") or {}).get("p99")
    lines = [f"# Chosen by `compress search {search.plan.path}`: trial {trial.number}, "
             f"{final['chosen']} in {search.dir / final['folder']}.",
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


def _measured_before(search, best: list) -> dict | None:
    """The last final bench, where it measured these same finalists: a finished search run again reports it
    rather than measuring (and choosing) anew."""
    path = search.dir / REPORT_DIR / "search.json"
    try:
        final = json.loads(path.read_text()).get("final")
    except (OSError, ValueError):
        return None
    if not final or not (search.dir / final["folder"]).is_dir():
        return None
    measured = [e["name"].split(":", 1)[0] for e in final["entries"]][2:]
    return final if measured == [f"trial-{t.number}" for t in best] else None


def finish(search, study, optuna, reference: dict) -> SearchResult:
    best = ranked(study, search.settings.objective)[: search.settings.finalists]
    final, chosen = None, None
    if best:
        final = _measured_before(search, best)
        if final is not None:
            search.say(f"the finalists ({', '.join(f'trial {t.number}' for t in best)}) were measured together "
                       f"before, in {search.dir / final['folder']}: that bench stands")
        else:
            search.say(f"finalists: {', '.join(f'trial {t.number}' for t in best)}, with the hand-set result and "
                       "the baseline, in one interleaved bench")
            final = final_bench(search, best, reference)
        if final["chosen"]:
            number = int(final["chosen"].split(":", 1)[0].removeprefix("trial-"))
            trial = next(t for t in best if t.number == number)
            chosen = {"trial": number, "params": trial.params, "artifact": final["chosen"],
                      "dir": trial.user_attrs["dir"], "pipeline": str(write_chosen(search, trial, final))}
    else:
        search.say("no trial was within the limits: nothing to re-measure", "yellow")
    report = write_search_report(search, study, optuna, reference, final, chosen)
    return SearchResult(report=report, chosen=chosen)
