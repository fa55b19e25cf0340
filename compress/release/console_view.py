"""What `compress release` and `compress verify` print: one line per fact, every check's outcome named."""
from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.markup import escape

from compress.release.bundle import CARD_MD
from export.tensorrt_engine import ENGINE_KIND


def print_release(release, out: Console) -> None:
    """The released file with its headline figures, each TensorRT engine shipped or withheld (and why)."""
    acc, lat, metric = release.card["accuracy"], release.card["latency"], release.card["accuracy"]["metric"]
    unknown = (acc.get("test_independence") or {}).get("status") == "unknown"
    out.print(f"released {release.artifact} to {release.folder}: {metric} {acc[metric]}% on {acc['test_images']} "
              f"test images{' (training data unknown: see the card)' if unknown else ''}, p99 {lat['p99']:.3g} ms (batch {lat['batch_size']}); card {release.folder / CARD_MD}",
              highlight=False, soft_wrap=True)
    for engine in release.card[ENGINE_KIND]:
        out.print(f"TensorRT engine {engine['artifact']} ({engine.get('precision')}) shipped: the bench measured it "
                  "and the gate passes it", highlight=False, soft_wrap=True)
    for engine in release.card[f"{ENGINE_KIND}_withheld"]:
        out.print(f"[yellow]TensorRT engine {engine['artifact']} ({engine.get('precision')}) not shipped[/]: "
                  f"{escape(engine['reason'])}", highlight=False, soft_wrap=True)
    if not release.passed:
        out.print("[red]marked NOT PASSED[/]: the release gate did not release it (--anyway)", highlight=False)


def print_verification(result, bundle: Path | str, out: Console) -> None:
    """Each check that held, failed or could not be made here, then the verdict with its reasons."""
    for line in result.checks:
        out.print(f"[green]ok[/] {escape(line)}", highlight=False, soft_wrap=True)
    for line in result.problems:
        out.print(f"[red]FAILED[/] {escape(line)}", highlight=False, soft_wrap=True)
    for line in result.unchecked:
        out.print(f"[yellow]NOT CHECKED[/] {escape(line)}", highlight=False, soft_wrap=True)
    why = [f"{len(result.problems)} check(s) failed"] if result.problems else []
    why += [f"{len(result.unchecked)} check(s) asked for could not be made here"] if result.unchecked else []
    verdict = "verified" if result.ok else f"NOT verified ({'; '.join(why)})"
    out.print(f"{escape(str(bundle))}: {verdict}", highlight=False, soft_wrap=True)
