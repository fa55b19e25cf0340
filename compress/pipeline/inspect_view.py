"""Tables of a run directory's manifest: what ran, how it went, what it made."""
from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from compress.errors import ArtifactError
from compress.pipeline.manifest import Manifest

# Metrics worth a column; the full set is in manifest.json.
KEY_METRICS = ("test_top1", "best_val_top1", "images_per_s", "peak_memory_mb", "precision", "amp_skipped_steps",
               "summary")


def _fmt_size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def environment_lines(manifest: Manifest) -> list[str]:
    """Which machine each stage's results come from: a run directory can hold stages from several."""
    by_env: dict[str | None, list[str]] = {}
    for record in manifest.stages.values():
        by_env.setdefault(record.environment, []).append(record.name)
    lines = []
    for digest, names in by_env.items():
        env = manifest.environments.get(digest or "", {})
        if not env:
            where = "an unrecorded machine (written by an older version)"
        else:
            gpu = f", GPU {env['gpu']['name']}" if env.get("gpu") else ""
            # each runtime's version; a manifest written before runtimes were recorded: its package versions
            versions = {name: (facts or {}).get("version") for name, facts in (env.get("runtimes") or {}).items()} \
                or env.get("packages") or {}
            where = (f"{env.get('cpu')} ({env.get('isa_summary')}), "
                     + ", ".join(f"{name} {v}" for name, v in versions.items() if v) + gpu)
        prefix = "ran on" if len(by_env) == 1 else f"{', '.join(names)} ran on"
        lines.append(f"{prefix}: {where}")
    return lines


def render(run_dir: Path, console: Console) -> None:
    manifest = Manifest.load(run_dir)
    if manifest is None:
        raise ArtifactError(f"{run_dir} has no manifest.json: not a run directory (run `compress run PIPELINE` first)")
    console.print(f"[bold]{manifest.pipeline}[/] — {run_dir}  (updated {manifest.updated})")
    if manifest.data:
        sizes = manifest.data.get("sizes", {})
        console.print(f"data {manifest.data.get('name')}: " + ", ".join(f"{k} {v}" for k, v in sizes.items())
                      + f"; split hash {str(manifest.data.get('split_hash', ''))[:12]}")
    for line in environment_lines(manifest):
        console.print(line, highlight=False)
    stages = Table(title="stages")
    for col in ("stage", "kind", "status", "duration", "metrics", "outputs"):
        stages.add_column(col)
    for record in manifest.stages.values():
        shown = [f"{k}={record.metrics[k]}" for k in KEY_METRICS if k in record.metrics]
        status = {"completed": "[green]completed[/]", "failed": "[red]failed[/]"}.get(record.status, record.status)
        if record.last_attempt:
            status += f"\n(a later attempt: {record.last_attempt['status']})"
        duration = f"{record.duration_s:.1f}s" if record.duration_s is not None else "-"
        stages.add_row(record.name, record.kind, status, duration, "\n".join(shown) or (record.error or ""),
                       "\n".join(record.outputs))
    console.print(stages)
    artifacts = Table(title="artifacts")
    for col in ("artifact", "kind", "size", "sha256", "path", "made from"):
        artifacts.add_column(col)
    for art in manifest.artifacts.values():
        problem = manifest.verify(run_dir, art.name)
        digest = art.sha256[:12] + ("" if problem is None else " [red](changed)[/]")
        artifacts.add_row(art.name, art.kind, _fmt_size(art.size_bytes), digest, art.path, ", ".join(art.made_from))
    console.print(artifacts)
