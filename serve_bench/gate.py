"""The release gate: ship the fastest artifact that meets both the accuracy red line and the p99 budget.

Two decision rules. ``point`` compares point estimates, as most tools do: on 1,000 test images
one image is 0.1 point, so an artifact whose true drop is just past the red line passes about
half the time. ``confident`` passes an artifact only when the upper bound of its paired 95%
drop interval is within the red line and the upper bound of its p99's block-bootstrap interval
is within the budget, so a release that passes is within both limits unless a 2.5% chance
went against it. Under either rule the result says when the test set is too small to show
an artifact within the red line, with the test-set size that would.
"""
from __future__ import annotations

from serve_bench.limits import Limits
from serve_bench.load.capacity import capacity, interval_trusted, loadgen_valid_for, passes
from serve_bench.release_choice import (gated_p99, gives_way, release_notes, release_order, server_run,  # noqa: F401
                                       unpaired_int8)
from serve_bench.report_model import Entry, Paired, ServerRun, SweepConfig
from train.detection.coco_map import needed_for_bootstrap
from serve_bench.stats.paired import (LEVEL, POWER, PairedCounts, drop_interval, needed_test_images,
                               smallest_certifiable_drop)


LATENCY_ONLY = ("accuracy not gated: the test labels are random (synthetic data), so accuracy drops measure "
                "noise; the gate decided on latency only")


def _needed_words(paired: Paired, max_drop: float) -> str:
    if paired.method == "paired-bootstrap":  # a detector's mAP: the bootstrap's spread, scaled as 1/√n
        needed = needed_for_bootstrap(paired.n, paired.drop, paired.sd, max_drop)
        if needed is not None:
            return (f"this test set of {paired.n:,} images is too small to show it within the red line: at the "
                    f"observed spread (bootstrap sd {paired.sd:.2f} points) that takes ≈ {needed:,} test images "
                    f"for an {POWER:.0%} chance")
        if paired.drop >= max_drop:
            return "its observed drop is itself at or past the red line, so no test set would show it within"
        return "the bootstrap shows no spread to scale from"
    counts = _counts(paired)
    needed = needed_test_images(counts, max_drop)
    if needed is not None:
        return (f"this test set of {paired.n:,} images is too small to show it within the red line: at the "
                f"observed disagreement ({paired.discordant} of {paired.n:,} images) that takes "
                f"≥ {needed:,} test images for an {POWER:.0%} chance")
    if counts.drop * 100 >= max_drop:
        return "its observed drop is itself at or past the red line, so no test set would show it within"
    return "no test set under a billion images would show it within the red line at this disagreement rate"


def _counts(paired: Paired) -> PairedCounts:
    return PairedCounts(paired.n, paired.baseline_only, paired.artifact_only)


def _drop_bound(art: Entry) -> tuple[float | None, str | None]:
    """Upper bound of the paired drop interval (points), or why there is none (an unpaired artifact has no
    drop at all and is refused before this is asked)."""
    paired = art.accuracy_paired
    if paired is None:
        return None, ("no paired accuracy in the report (written by an older version): re-run the bench stage, "
                      "or decide with --decision point")
    if paired.reference:
        return 0.0, None
    if paired.method == "paired-bootstrap":
        return paired.drop_ci[1], None
    return drop_interval(_counts(paired))[1], None


def _p99_bound(art: Entry) -> tuple[float | None, str | None]:
    interval = art.latency_ms.p99_ci_blocks
    if not interval:
        return None, ("no block interval of the p99 in the report (written by an older version): re-run the "
                      "bench stage, or decide with --decision point")
    return interval[1], None


def _accuracy_problems(art: Entry, max_drop: float, decision: str, notes: list[str]) -> list[str]:
    drop, problems = art.accuracy_drop, []
    if art.refused:
        problems.append(art.refused)
    if drop is None:
        paired = art.accuracy_paired
        problems.append(f"accuracy not paired with the baseline ({paired.unpaired})"
                        if paired is not None and paired.unpaired is not None else "no accuracy measured")
        return problems
    if drop > max_drop:
        problems.append(f"accuracy drop {drop:.2f} points > red line {max_drop:g}")
        return problems
    upper, missing = _drop_bound(art)
    if decision == "confident":
        if missing:
            problems.append(missing)
        elif upper > max_drop:
            problems.append(f"accuracy drop {drop:.2f} points, 95% upper bound {upper:.2f} > red line {max_drop:g}; "
                            + _needed_words(art.accuracy_paired, max_drop))
    elif upper is not None and upper > max_drop:
        notes.append(f"{art.name} is within the red line on the point estimate ({drop:.2f} points) but not "
                     f"shown within it at 95% (upper bound {upper:.2f}): " + _needed_words(art.accuracy_paired,
                                                                                         max_drop))
    return problems


def _server_problems(run: ServerRun, budget: float | None, decision: str) -> list[str]:
    """P99 at the arrival rate the pipeline names, from LoadGen's run: what an online release is gated on."""
    rate = f"{run.offered_qps:,.1f} queries/s"
    if not run.sustainable:
        return [f"at {rate}: {run.sustainable_reason or 'not sustainable'}"]
    if run.errors:
        return [f"at {rate}: the model failed while serving ({run.errors[0]})"]
    p99 = (run.latency_ms or {}).get("p99")
    if p99 is None:
        return [f"at {rate}: no p99 measured"]
    if budget is None:
        return []
    if p99 > budget:
        return [f"p99 {p99:.3f} ms at {rate} > budget {budget:g} ms"]
    if decision == "confident":
        written = run.written()
        if loadgen_valid_for(written, budget) is False:
            said = "; ".join(run.loadgen.invalid_reasons + run.loadgen.early_stopping) or "no reason given"
            return [f"p99 {p99:.3f} ms at {rate}, but LoadGen found the run INVALID for a p99 claim against "
                    f"{budget:g} ms ({said})"]
        steady = run.steady_state
        if not interval_trusted(written):
            return [f"p99 {p99:.3f} ms at {rate}, but its interval is not precise ({steady.reason}; "
                    f"{steady.queries} queries{', the cap' if steady.capped else ''}): not shown within "
                    f"the {budget:g} ms budget"]
        upper = run.p99_ci[1] if run.p99_ci else None
        level = f"{steady.level:.0%}" if steady is not None and steady.level else "95%"
        how = ("steady state, Woodruff over busy periods" if steady is not None and steady.written()
               else "block bootstrap over the schedule")
        if upper is None or upper > budget:
            return [f"p99 {p99:.3f} ms at {rate}, {level} upper bound "
                    f"{'unknown' if upper is None else f'{upper:.3f} ms'} ({how}) > budget {budget:g} ms"]
    return []


def capacity_disagreement(art: Entry, run: ServerRun, budget: float | None, decision: str = "point") -> str | None:
    """Words for a refusal at the pipeline's rate that the same report's capacity table contradicts: a
    configuration of the same serving settings, judged by the same rule and budget, carried at least that rate.
    The at-target run is the one gated; the report says the two disagree instead of leaving the reader to find it."""
    rule = "confident" if decision == "confident" else "point"
    rate = run.offered_qps
    for config in _configs(art):
        cap = config.capacity
        same = run.serving is not None and config.serving is not None and config.serving.knobs() == run.serving.knobs()
        if (same and rate and cap is not None and cap.qps and cap.qps >= rate and cap.budget_ms == budget
                and cap.rule == rule):
            how = "confirmed by a full-length run" if cap.confirmed else "from its probes"
            return (f"the same bench's capacity table has {cap.qps:,.1f}/s within the budget for "
                    f"{config.label} ({how}): the at-target run and the sweep disagree (a disturbed run, "
                    "or a p99 too close to the budget to tell); the at-target run is the one gated")
    return None


def _configs(art: Entry) -> list[SweepConfig]:
    """The serving configurations the traffic sweep measured for ``art`` (none where it was not swept): through its
    server where the gate reads the served run."""
    sweep = art.traffic.gated_sweep() if art.traffic is not None else None
    return sweep.configs if sweep is not None else []


def _latency_problems(art: Entry, budget: float | None, decision: str) -> list[str]:
    run = server_run(art)
    if run is not None:
        problems = _server_problems(run, budget, decision)
        if art.traffic.measured_at == "served":
            problems = [f"through its model server, {p}" for p in problems]
        about_p99 = bool(problems) and problems[0].startswith("p99 ")  # not a failed model or an unknown queue
        why = capacity_disagreement(art, run, budget, decision) if about_p99 else None
        return [f"{problems[0]}; {why}", *problems[1:]] if why else problems
    if art.traffic is not None and art.traffic.scenario == "server":
        if art.traffic.measured_at == "served":
            served = art.traffic.served
            why = served.failed if served is not None and served.failed else "not served"
            return [f"no run through its model server (latency.measured_at served): {why}"]
        return ["no run at the pipeline's traffic (latency.scenario server) in the report: re-run the bench stage"]
    p99 = art.latency_ms.p99
    if budget is None:
        return []
    if p99 > budget:
        return [f"p99 {p99:.3f} ms > budget {budget:g} ms"]
    if decision == "confident":
        upper, missing = _p99_bound(art)
        if missing:
            return [missing]
        if upper > budget:
            return [f"p99 {p99:.3f} ms, 95% upper bound {upper:.3f} ms (block bootstrap) > budget {budget:g} ms"]
    return []


def _test_set_note(artifacts: list[Entry], max_drop: float) -> str | None:
    paired = [a.accuracy_paired for a in artifacts if a.accuracy_paired is not None]
    if any(p.method == "paired-bootstrap" for p in paired):
        return None  # a detector's mAP: each candidate's bootstrap says what test size would show it
    sizes = {p.n for p in paired} - {None}
    if len(sizes) != 1:
        return None
    n = sizes.pop()
    tightest = smallest_certifiable_drop(n)
    if tightest <= max_drop:
        return None
    needed = needed_test_images(PairedCounts(n, 0, 0), max_drop)
    return (f"the test set of {n:,} images cannot show any artifact but the baseline within a red line of "
            f"{max_drop:g} points at 95%: even one that agrees with the baseline on every image has an upper "
            f"bound of {tightest:.2f} points; "
            + (f"that takes ≥ {needed:,} test images" if needed else "no test set can show a red line this tight"))


def rejudged(config: SweepConfig, budget_ms: float | None, rule: str) -> dict:
    """A configuration's capacity judged again under another budget or rule: from its probes, then checked by its
    confirmation run where that ran at or below the new capacity (a rate a full-length run refuted stays refuted)."""
    curve = [run.written() for run in config.curve]
    found = capacity(curve, budget_ms, rule)
    check = config.capacity.confirmation if config.capacity is not None else None
    if found["qps"] and check is not None and check.offered_qps and check.offered_qps <= found["qps"]:
        if not passes(check.written(), budget_ms, rule):
            below = [r for r in curve if r["offered_qps"] < check.offered_qps]
            return capacity(below, budget_ms, rule)
    return found


def carried_load(art: Entry, budget_ms: float | None = None, decision: str | None = None) -> float | None:
    """The most traffic the artifact carries within the budget (its best serving configuration), if swept.
    Given a rule (``decision``) and budget other than the ones the sweep was judged by (a report re-gated),
    every configuration's capacity is judged again from its curve; LoadGen's validity then counts only where
    it was about this budget (serve_bench.load.capacity.passes)."""
    sweep = art.traffic.gated_sweep() if art.traffic is not None else None  # through its server, under served
    best = sweep.best if sweep is not None else None
    if decision is None:
        return best.capacity.qps if best is not None else None
    rule = "confident" if decision == "confident" else "point"
    stored = best.capacity if best is not None else None
    if stored is not None and stored.budget_ms == budget_ms and stored.rule == rule:
        return stored.qps
    loads = [rejudged(c, budget_ms, rule)["qps"] for c in _configs(art)]
    loads = [q for q in loads if q is not None]
    return max(loads) if loads else None


def preferred(candidates: list[Entry], budget_ms: float | None = None, decision: str | None = None) -> Entry:
    """Where every candidate was swept, the one that carries the most traffic within the budget; otherwise the
    lowest p99 (at the pipeline's traffic for the server scenario, else closed loop)."""
    loads = [carried_load(a, budget_ms, decision) for a in candidates]
    if all(load is not None for load in loads):
        return candidates[max(range(len(candidates)), key=lambda i: (loads[i], -i))]  # ties: the first listed
    return min(candidates, key=gated_p99)


def evaluate(artifacts: list[Entry], limits: Limits, accuracy_meaningful: bool = True) -> dict:
    """``artifacts`` are report entries with ``accuracy_drop`` (points, positive = worse), ``latency_ms.p99``
    and, for ``decision="confident"``, ``accuracy_paired`` (the per-image agreement counts) and
    ``latency_ms.p99_ci_blocks``; ``limits`` are the red line, the budget and the rule, recorded in the result
    under their pipeline-file names. Every entry is judged, the baseline's own files made as they are (export
    alone, compile alone: role ``reference``) too, so a run never releases less than exporting the model by hand.
    A model in torch eager is released only where no exported or compiled file passes (:func:`release_order`).

    ``accuracy_meaningful`` false (synthetic data): a drop of random labels says nothing about
    the artifact, so the red line is not applied and the result says the gate saw latency only.
    """
    p99_budget_ms, max_accuracy_drop, decision = limits.p99_budget_ms, limits.max_drop, limits.decision
    reasons, candidates, notes = [], [], []
    for art in artifacts:
        problems = _accuracy_problems(art, max_accuracy_drop, decision, notes) if accuracy_meaningful else []
        problems += _latency_problems(art, p99_budget_ms, decision)
        if problems:
            reasons.append(f"{art.name}: " + "; ".join(problems))
        else:
            candidates.append(art)
    # The release is chosen among the exported and compiled files that passed (torch eager only where none did).
    # The INT8/fp32 ratio decides where that pool is ranked by p99 (at the pipeline's traffic, or closed loop), not
    # where it is ranked by the load each file carried within the budget (every file in it swept).
    pool = release_order(candidates)
    by_p99 = not pool or not all(carried_load(a, p99_budget_ms, decision) is not None for a in pool)
    yields = {a.name: gives_way(a, pool) for a in pool} if by_p99 else {}
    gave_way = [why for why in yields.values() if why] + (unpaired_int8(pool) if by_p99 else [])
    ranked = [a for a in pool if not yields.get(a.name)]
    release = preferred(ranked or pool, p99_budget_ms, decision).name if candidates else None
    if release is None:
        what = "the accuracy red line and the p99 budget" if accuracy_meaningful else "the p99 budget"
        reasons.insert(0, f"no artifact meets {'both ' if accuracy_meaningful else ''}{what}"
                       + (" at 95% confidence" if decision == "confident" else ""))
    if accuracy_meaningful:
        small = _test_set_note(artifacts, max_accuracy_drop)
        notes = ([small] if small else []) + notes
    else:
        notes = [LATENCY_ONLY]
    family = family_claim(len(artifacts)) if decision == "confident" else None
    if family and len(artifacts) > 1:
        notes.append(family["words"])
    return {"limits": limits.as_dict(), "passed": release is not None,
            "release": release, "reasons": reasons,
            "decided_on": "accuracy and latency" if accuracy_meaningful else "latency only",
            "notes": notes + gave_way + _capacity_notes(candidates, p99_budget_ms, decision)
            + release_notes(release, artifacts, candidates, reasons), "decision": decision,
            "confidence": LEVEL, "family_error_bound": family["bound"] if family else None,
            **_latency_basis(artifacts, pool, p99_budget_ms, decision)}


def family_claim(judged: int) -> dict:
    """What `confident` claims about the released artifact when it is picked among ``judged`` candidates, each
    tested at one-sided 2.5% per limit: the chance that the one released is past a limit is up to K × 2.5%
    (any of K candidates at the limit may pass, and the pick takes one of them), not 2.5%. The
    search corrects its finalists (Bonferroni); the bench states the bound instead (tests/test_gate.py simulates
    it with every candidate exactly at the budget)."""
    bound = min(1.0, max(judged, 1) * (1 - LEVEL) / 2)
    return {"bound": round(bound, 4),
            "words": (f"`confident` tests each of the {judged} candidates at one-sided 2.5% per limit; picking the "
                      f"release among those that pass, the chance that it is past a limit is up to {judged} × 2.5% = "
                      f"{bound:.1%} (Bonferroni: no assumption on how the candidates' errors relate), not 2.5%; the "
                      "server p99's upper end covered 95.5-99.7% of known-answer runs, so read its share as up to "
                      "4.5% a candidate (the search corrects its finalists for this)")}


def _capacity_notes(candidates: list[Entry], budget_ms: float | None, decision: str) -> list[str]:
    """Where an artifact passed at the pipeline's traffic but its sweep shows less headroom than that rate (the
    probe grid's resolution, or noise between the two measurements), say so rather than rank it silently."""
    notes = []
    for art in candidates:
        run, load = server_run(art), carried_load(art, budget_ms, decision)
        if run is not None and load is not None and load < run.offered_qps:
            notes.append(f"{art.name} passed at {run.offered_qps:,.1f} queries/s, but its sweep's highest load "
                         f"within the budget is {load:,.1f}/s: little headroom above the traffic it must carry")
    return notes


def _latency_basis(artifacts: list[Entry], candidates: list[Entry], budget_ms: float | None, decision: str) -> dict:
    """What "p99" meant for this gate and how the release was chosen among the artifacts that pass."""
    server = [server_run(a) for a in artifacts if server_run(a) is not None]
    served = any(a.traffic is not None and a.traffic.measured_at == "served" for a in artifacts)
    basis = (f"server scenario at {server[0].offered_qps:,.1f} queries/s (Poisson arrivals, MLPerf LoadGen)"
             + (", through the model server each file ships on (the client's p99)" if served else "")
             if server else "single-stream (closed loop, one request at a time)")
    swept = bool(candidates) and all(carried_load(a, budget_ms, decision) is not None for a in candidates)
    return {"latency_basis": basis,
            "ranked_by": "most traffic within the p99 budget (best serving configuration)" if swept else "lowest p99"}
