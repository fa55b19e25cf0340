"""The doctor's tables. Everything shown is in the JSON too; this module only lays it out.

Cell text is plain ``Text``, never markup: install hints read ``compress[cpu]``, which rich would
take for a style tag. The lines a user acts on (a failed runtime, the verdict) are printed unwrapped
so they can be copied and searched whatever the terminal's width.
"""
from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

STYLE = {"PASS": "green", "FAIL": "bold red", "SKIP": "yellow", "ok": "green", "not installed": "yellow",
         "unusable here": "yellow", "broken": "bold red"}


def _table(title: str, *columns: str) -> Table:
    table = Table(title=title, title_justify="left", show_lines=False)
    for column in columns:
        table.add_column(column, overflow="fold")
    return table


def _cell(value, style: str | None = None) -> Text:
    return Text("" if value is None else str(value), style=style or "")


def machine_table(m: dict) -> Table:
    table = _table("Machine", "fact", "value")
    rows = [
        ("CPU", m["cpu"]),
        ("cores", f"{m['physical_cores']} physical, {m['logical_cores']} logical"),
        ("instruction set", m["isa_summary"]),
        ("CPU flags allow / torch uses", f"{m['cpu_flags_level']} / {m['torch_cpu_capability']}"),
        ("limited ISA", "; ".join(m["isa_limits"]) or "no: torch and oneDNN use what the CPU has"),
        ("native bf16 / fp16", f"{'yes' if m['native_bf16'] else 'no'} / {'yes' if m['native_fp16'] else 'no'}"),
        ("INT8 dot product", f"{m['int8_dot_product']}: " + (
            "native (one fused instruction)" if m["int8_dot_product_native"] else "not native (no VNNI or AMX)")),
        ("torch threads", m["torch_threads"]),
        ("GPU", (m["gpu"] or {}).get("name", "none visible")),
    ]
    rows += [("note", note) for note in m["isa_notes"]]
    for fact, value in rows:
        table.add_row(_cell(fact), _cell(value, "bold red" if fact == "limited ISA" and m["isa_limited"] else None))
    return table


def runtimes_table(rows: list[dict]) -> Table:
    table = _table("Runtimes", "runtime", "status", "version", "devices", "detail")
    for row in rows:
        table.add_row(_cell(row["name"]), _cell(row["status"], STYLE.get(row["status"])), _cell(row["version"]),
                      _cell(", ".join(row["devices"])), _cell(row["detail"]))
    return table


def defaults_table(choices: list[dict]) -> Table:
    table = _table("What the defaults will choose here, and why", "setting", "choice", "why")
    for choice in choices:
        table.add_row(_cell(choice["setting"]), _cell(choice["choice"], "bold"), _cell(choice["why"]))
    return table


def smoke_table(smoke: dict) -> Table:
    table = _table(f"Smoke run ({smoke.get('model', 'tiny model')}; export {smoke['export']})",
                   "runtime", "status", "p50 ms", "max |Δlogit| vs torch", "detail")
    for r in smoke["results"]:
        table.add_row(_cell(r["runtime"]), _cell(r["status"], STYLE.get(r["status"])),
                      _cell(None if r["p50_ms"] is None else f"{r['p50_ms']:.3f}"),
                      _cell(None if r["max_abs_diff"] is None else f"{r['max_abs_diff']:.1e}"), _cell(r["detail"]))
    return table


def print_smoke(smoke: dict, console: Console) -> None:
    console.print(smoke_table(smoke))
    if smoke.get("busy"):
        console.print(Text(f"note: other processes used {100 * smoke['other_processes_share']:.0f}% of the cores "
                           "while the runtimes ran: the p50s include them (the agreement with torch does not depend "
                           "on it)", style="yellow"), soft_wrap=True)
    for r in smoke["results"]:
        if r["status"] == "FAIL":
            console.print(Text(f"FAIL {r['runtime']}: {r['detail']}", style="bold red"), soft_wrap=True)


def print_gpu(gpu: dict, console: Console) -> None:
    if gpu["gpu"] is None:
        console.print(Text(f"no GPU: {gpu['reason']}; nothing to check (exit 0)"), soft_wrap=True)
        return
    table = _table(f"GPU check on {gpu['gpu']}", "step", "status", "exit code", "seconds", "detail")
    for step in gpu["steps"]:
        status = "PASS" if step["passed"] else "FAIL"
        table.add_row(_cell(step["name"]), _cell(status, STYLE[status]), _cell(step["returncode"]),
                      _cell(step["seconds"]), _cell(step["detail"]))
    console.print(table)
    print_verdict({"gpu_check": gpu, "exit_code": 0 if gpu["passed"] else 3}, console)


def print_verdict(report: dict, console: Console) -> None:
    failed = [r["runtime"] for r in report.get("smoke", {}).get("results", []) if r["status"] == "FAIL"]
    failed += [s["name"] for s in report.get("gpu_check", {}).get("steps", []) if not s["passed"]]
    if failed:
        line = f"doctor: FAILED: {', '.join(failed)} (exit {report['exit_code']})"
    else:
        line = f"doctor: every check passed (exit {report['exit_code']})"
    console.print(Text(line, style="bold red" if failed else "bold green"), soft_wrap=True)
