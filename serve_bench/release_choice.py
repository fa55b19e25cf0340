"""Which passing file is released: exported and compiled files before torch eager, the baseline's own files
(made as it is) among the candidates, an INT8 or compressed file giving way to the float file it is not shown faster
than, and the notes that say what compression bought. The gate (:mod:`serve_bench.gate`) judges each file against
the limits; this module chooses among those that passed and says why."""
from __future__ import annotations

from serve_bench.report_model import Entry, ServerRun
from serve_bench.runners import RUNNERS


def server_run(art: Entry) -> ServerRun | None:
    """The artifact's run at the pipeline's traffic when the pipeline gates on the server scenario."""
    return art.server_run()


def gated_p99(art: Entry) -> float:
    """The p99 the gate ranks by: at the pipeline's traffic for the server scenario, else closed loop."""
    run = server_run(art)
    return run.latency_ms["p99"] if run is not None and (run.latency_ms or {}).get("p99") is not None \
        else art.latency_ms.p99


def in_eager(art: Entry) -> bool:
    """Whether the entry is a model run by its framework as written (torch eager), not an exported or compiled
    file: what a user has before deploying anything."""
    runner = RUNNERS.get(art.runtime or "")
    return runner is not None and runner.eager


def baseline_file(art: Entry) -> bool:
    """Whether the entry is the baseline model's own file, made as it is (export alone, compile alone): the
    reference every compressed file is divided by, and a candidate like any other."""
    return art.role == "reference"


def release_order(candidates: list[Entry]) -> list[Entry]:
    """The candidates the release is chosen among: every exported or compiled file that passed, of any model (the
    baseline's own, made as it is, included); the models in torch eager only where none did. Eager PyTorch is what
    a user has before deploying anything, so shipping it while a deployable file of the same weights passed would
    leave them worse off than a five-line export."""
    deployable = [a for a in candidates if not in_eager(a)]
    return deployable or candidates


def yields_to_float(art: Entry, candidates: list[Entry]) -> str | None:
    """Why an INT8 candidate gives way to the fp32 file of the same model on the same runtime, or None.

    Quantization is a risk to accuracy taken for speed; where the p99 ratio of the INT8 file over that fp32 file,
    measured paired, does not show it faster, and the fp32 file passed the gate too, the risk buys nothing that
    this run can show, so the float file is preferred. A lower point p99 inside a ratio interval that reaches 1 is
    noise between two files, not a reason to ship INT8. The ratio is the one the release is ranked by: under traffic
    at the pipeline's rate, the two files' rounds paired (``at_target.paired["fp32"]``); closed loop, the blocks
    of the same rounds (``int8_vs_fp32``). ``candidates`` are the files that passed."""
    if art.precision != "int8":
        return None
    run = server_run(art)
    if run is not None:
        ratio = (run.paired or {}).get("fp32")
        reference, level = (ratio.reference, ratio.level or 0.95) if ratio is not None else (None, 0.95)
        through = " through their model server" if getattr(ratio, "through", None) == "served" else ""
        how = f"{through} at {run.offered_qps:g} queries/s, paired round by round".lstrip() if ratio is not None else ""
    else:
        pair, level = art.int8_vs_fp32, 0.95
        ratio, reference, how = (pair.p99, pair.reference, "block-paired") if pair is not None else (None, None, "")
    passed = {c.name: c for c in candidates}
    if ratio is None or ratio.verdict == "faster" or reference not in passed:
        return None
    same = passed[reference].source_model == art.source_model
    what = "same model and runtime" if same else "the baseline model as it is, same runtime"
    return (f"{art.name} (int8) gives way to {reference} (fp32, {what}, also within both "
            f"limits): its p99 over that file's, {how}, is ×{ratio.ratio:.2f} "
            f"({level:.0%} CI {ratio.ci[0]:.2f}–{ratio.ci[1]:.2f}, {ratio.verdict}), so "
            f"{'quantization' if same else 'compression'} buys no latency this run can show")


def yields_to_baseline_file(art: Entry, candidates: list[Entry]) -> str | None:
    """Why a compressed candidate gives way to the baseline's own file on its runtime (export alone, compile alone),
    or None: the rule INT8 files follow, for every compression step. Pruning and distillation are accuracy risks
    taken for speed too; where the candidate's p99 over the baseline as it is, block-paired (``vs_export_alone``),
    does not show it faster and that file passed the gate, the baseline as it is ships. Closed loop only: ranked
    under traffic, the candidates' own traffic runs decide."""
    pair = art.vs_export_alone
    if baseline_file(art) or pair is None or server_run(art) is not None:
        return None
    passed = {c.name: c for c in candidates}
    if pair.reference not in passed or pair.p99.verdict == "faster":
        return None
    ratio = pair.p99
    return (f"{art.name} gives way to {pair.reference} (the baseline model as it is, same runtime, also within "
            f"both limits): its p99 over that file's, block-paired, is ×{ratio.ratio:.2f} (95% CI "
            f"{ratio.ci[0]:.2f}–{ratio.ci[1]:.2f}, {ratio.verdict}), so compression buys no latency this run can "
            "show")


def gives_way(art: Entry, candidates: list[Entry]) -> str | None:
    """Why ``art`` gives way to a float file that passed (its fp32 file, or the baseline as it is), or None."""
    return yields_to_float(art, candidates) or yields_to_baseline_file(art, candidates)


def unpaired_int8(candidates: list[Entry]) -> list[str]:
    """A note per INT8 candidate ranked by its p99 at the pipeline's traffic without a ratio to its fp32 file there
    (its rounds held too few queries in complete busy periods, or a report from before the rounds): the gate could
    not ask whether quantization bought latency, and says so instead of letting the point p99 decide in silence."""
    names = {c.name for c in candidates}
    out = []
    for art in candidates:
        run, pair = server_run(art), art.int8_vs_fp32
        if art.precision == "int8" and pair is None:  # not even the baseline's own file measured on its runtime
            out.append(f"{art.name} (int8) has no fp32 file on {art.runtime} to be paired with (neither of its model "
                       "nor the baseline's as it is): ranked by its p99 alone, without asking whether quantization "
                       "bought latency")
            continue
        if art.precision != "int8" or run is None or pair is None or pair.reference not in names:
            continue
        if (run.paired or {}).get("fp32") is None and art.traffic.measured_at == "served":
            out.append(f"{art.name} (int8) is not paired with {pair.reference} (fp32) through their servers (its "
                       "fp32 file was not served beside it, or their rounds held too few queries in complete busy "
                       "periods): ranked by its served p99 alone (latency.measured_at served), without asking "
                       "whether quantization bought latency")
        elif (run.paired or {}).get("fp32") is None:
            out.append(f"{art.name} (int8) is not paired with {pair.reference} (fp32) at {run.offered_qps:g} "
                       "queries/s (too few rounds with 100 queries in complete busy periods in both): ranked by "
                       "its p99 alone, without asking whether quantization bought latency")
    return out


def _paired_with_release(best: Entry, release: str) -> str | None:
    """``best``'s p99 over the released file's in words, paired on the basis the gate ranked by: under traffic the
    rounds of its run at the pipeline's rate (through the server where the gate read that), closed loop the blocks;
    None where they were not paired on that basis."""
    run = server_run(best)
    if run is not None:
        ratio = next((r for r in (run.paired or {}).values() if r.reference == release), None)
        if ratio is None:
            return None
        through = " through their model server" if getattr(ratio, "through", None) == "served" else ""
        return (f"×{ratio.ratio:.2f} the released file's{through} at {run.offered_qps:g} queries/s, paired round "
                f"by round ({(ratio.level or 0.95):.0%} CI {ratio.ci[0]:.2f}–{ratio.ci[1]:.2f}, {ratio.verdict})")
    pair = next((p for p in (best.int8_vs_fp32, best.vs_export_alone) if p is not None and p.reference == release),
                None)
    if pair is None:
        return None
    return (f"×{pair.p99.ratio:.2f} the released file's, block-paired (95% CI {pair.p99.ci[0]:.2f}–"
            f"{pair.p99.ci[1]:.2f}, {pair.p99.verdict})")


def _missed(art: Entry, reasons: list[str]) -> str:
    """Why a file that did not pass failed, in the gate's own words."""
    said = next((r for r in reasons if r.startswith(f"{art.name}: ")), None)
    return said.removeprefix(f"{art.name}: ") if said else "it gave way to another file"


def release_notes(release: str | None, artifacts: list[Entry], candidates: list[Entry], reasons: list[str]
                  ) -> list[str]:
    """What the release says about compression: where the baseline's own file (made as it is) is released,
    compression bought nothing within the limits, and by how much the best compressed file missed; where a model in
    torch eager is released, which exported or compiled file came closest and why it failed."""
    chosen = next((a for a in artifacts if a.name == release), None)
    if chosen is None:
        return []
    passed = {c.name for c in candidates}
    base = next((a.name for a in artifacts if a.accuracy_paired is not None and a.accuracy_paired.reference), None)

    def as_is(art: Entry) -> bool:  # the baseline's weights as they are, in any float file made of them
        return baseline_file(art) or (base is not None and base in (art.name, art.source_model)
                                      and art.precision != "int8")

    if as_is(chosen) and not in_eager(chosen):
        compressed = [a for a in artifacts if not as_is(a)]
        if not compressed:
            return [f"{release} is the baseline model as it is ({chosen.precision} on {chosen.runtime}); no "
                    "compressed file was measured beside it"]
        within = [a for a in compressed if a.name in passed]
        if within:
            best = min(within, key=gated_p99)
            how = _paired_with_release(best, release) or \
                f"×{gated_p99(best) / gated_p99(chosen):.2f} the released file's (point p99s, not paired)"
            missed = (f"the fastest compressed file within both limits, {best.name}, has p99 "
                      f"{gated_p99(best):.3f} ms: {how}")
        else:
            best = min(compressed, key=gated_p99)
            missed = (f"no compressed file passed; the fastest, {best.name} (p99 {gated_p99(best):.3f} ms), "
                      f"failed: {_missed(best, reasons)}")
        return [f"compression bought nothing within the limits: the release, {release}, is the baseline model "
                f"made as it is ({chosen.precision} on {chosen.runtime}, p99 {gated_p99(chosen):.3f} ms); {missed}"]
    if in_eager(chosen):
        deployable = [a for a in artifacts if not in_eager(a)]
        if not deployable:
            return [f"{release} runs in torch eager: no exported or compiled file was measured (add an export "
                    "stage; the bench's export alone is off, or could not be made: its log says why)"]
        best = min(deployable, key=gated_p99)
        return [f"{release} runs in torch eager because no exported or compiled file of any model passed; the "
                f"fastest, {best.name} (p99 {gated_p99(best):.3f} ms), failed: {_missed(best, reasons)}"]
    return []
