"""Per-operator profiles in the report: where each artifact's time goes, and the Q/DQ its runtime left unfused.

The profiles themselves are taken in each artifact's worker (serve_bench.latency.operator_profile); this
module only renders them, so the report can be re-rendered from report.json alone.
"""
from __future__ import annotations

from serve_bench.report_model import Entry, Report
from serve_bench.runners import runtime_title
from serve_bench.runners.channel_widths import width_words
from serve_bench.runners.kernel_census import census_line

Table = tuple[list[str], list[list[str]]]


def fmt(value, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def profile_table(profile: dict, top: int = 8) -> Table:
    """The ``top`` op types by time, then one row for the rest."""
    head = ["op", "ms/run", "share", "calls/run"]
    ops = profile.get("ops", [])
    rows = [[o["op"], fmt(o["ms_per_run"]), f"{o['share'] * 100:.1f}%", fmt(o["calls_per_run"], 1)]
            for o in ops[:top]]
    rest = ops[top:]
    if rest:
        rows.append([f"other ({len(rest)} op types)", fmt(sum(o["ms_per_run"] for o in rest)),
                     f"{sum(o['share'] for o in rest) * 100:.1f}%", fmt(sum(o["calls_per_run"] for o in rest), 1)])
    return head, rows


def unfused_qdq_line(name: str, profile: dict, shown: int = 3) -> str | None:
    """One sentence naming the Q/DQ nodes the runtime left unfused, or None when there are none."""
    nodes = profile.get("unfused_qdq") or []
    if not nodes:
        return None
    more = f" and {len(nodes) - shown} more" if len(nodes) > shown else ""
    names = ", ".join(n["node"] for n in nodes[:shown]) + more
    ms = sum(n["ms_per_run"] for n in nodes)
    return (f"{name}: {profile.get('runtime', 'the runtime')} ran {len(nodes)} Q/DQ node"
            f"{'s' if len(nodes) != 1 else ''} unfused ({names}), {ms:.3f} ms per run: float conversions "
            "left around operators that did not become integer kernels.")


def kernel_section(report: Report) -> list[tuple[str, Table]]:
    """One table of what each runtime made of each file: compute layers run in int8 against float, the Q/DQ it
    left unfused, and the time of the float layers (from the runtime's own profile, not from the file)."""
    rows = []
    for art in report.artifacts:
        profile = art.operator_profile or {}
        kernels = profile.get("kernels")
        if not kernels:
            continue
        unfused = len(profile.get("unfused_qdq") or [])
        slowest = ", ".join(f"{n['node']} ({n['precision']})" for n in kernels["float_layers"][:2])
        rows.append([art.name, profile.get("runtime", "?"), art.precision or "?", str(kernels["integer"]),
                     str(kernels["float"]) + (f" ({'/'.join(kernels['float_precisions'])})" if kernels["float"] else ""),
                     str(unfused), fmt(kernels["float_ms"]), slowest or "—"])
    if not rows or not any(r[2] == "int8" for r in rows):
        return []
    head = ["file", "runtime", "precision", "int8 compute layers", "float compute layers", "Q/DQ unfused",
            "float layers ms/run", "slowest float layers"]
    return [("Compute layers as each runtime ran them (from its profile)", (head, rows))]


def profile_sections(report: Report) -> list[tuple[str, Table]]:
    """One table per profiled artifact ("Where the time goes: NAME"), with what the times are in its title."""
    out = []
    for art in report.artifacts:
        profile = art.operator_profile
        if not profile or profile.get("error") or not profile.get("ops"):
            continue
        run = f", {profile['run_ms']:.3f} ms per run under the profiler" if profile.get("run_ms") else ""
        if profile.get("kernels"):
            run += f"; {census_line(profile['kernels'], len(profile.get('unfused_qdq') or []))}"
        out.append((f"Where the time goes: {art.name} ({profile['runtime']}, batch {profile['batch_size']}"
                    f"{run})", profile_table(profile)))
    return out


def unfused_qdq_flags(entries: list[Entry]) -> list[str]:
    """A report flag per artifact whose runtime ran Q/DQ nodes unfused, naming them."""
    lines = [unfused_qdq_line(e.name, e.operator_profile) for e in entries if e.operator_profile]
    return [line for line in lines if line]


def slower_than_unpruned_flags(entries: list[Entry]) -> list[str]:
    """A flag per compressed file shown slower than the unpruned model's fp32 ONNX on its own runtime (p50 or p99,
    block-paired), naming the likely cause read from the file and its profile: channel counts off the multiple the
    runtime's convolutions want, Q/DQ the runtime left unfused; or saying that neither explains it."""
    flags = []
    for art in entries:
        ratio = art.vs_export_alone
        if ratio is None or "slower" not in (ratio.p50.verdict, ratio.p99.verdict):
            continue
        causes = []
        widths = art.channel_widths or {}
        mine, theirs = widths.get("file") or {}, widths.get("unpruned") or {}
        if mine.get("off_multiple", 0) > theirs.get("off_multiple", 0):
            causes.append(width_words(mine, runtime_title(art.runtime)))
        unfused = len((art.operator_profile or {}).get("unfused_qdq") or [])
        if unfused:
            causes.append(f"{runtime_title(art.runtime)} ran {unfused} Q/DQ nodes unfused (float conversions around "
                          "operators that did not become integer kernels)")
        said = "; ".join(causes) if causes else ("neither its channel counts nor unfused Q/DQ explain it: compare the "
                                                 "two profiles in the report")
        flags.append(f"{art.name} is slower than the unpruned model exported as it is ({ratio.reference}) on the same "
                     f"runtime: p50 ×{ratio.p50.ratio:.2f} [{ratio.p50.ci[0]:.2f}, {ratio.p50.ci[1]:.2f}], p99 "
                     f"×{ratio.p99.ratio:.2f} [{ratio.p99.ci[0]:.2f}, {ratio.p99.ci[1]:.2f}]. Likely cause: {said}")
    return flags


def profile_failures(entries: list[Entry]) -> list[str]:
    """Why an artifact has no profile (its runtime's profiler failed or is absent here), for the notes."""
    return [f"{e.name}: not profiled ({e.operator_profile['error']})" for e in entries
            if (e.operator_profile or {}).get("error")]
