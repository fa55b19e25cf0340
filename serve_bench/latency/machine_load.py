"""How busy the machine was with other work while a block was measured.

Latency measured beside another CPU-bound process is the neighbour's as much as the
artifact's. The kernel's counters say how much CPU time the whole machine spent busy during
a block (/proc/stat) and how much of it was ours (the bench process and its workers,
/proc/<pid>/stat); the rest was other processes. Linux only; elsewhere nothing is sampled
and the report says so.
"""
from __future__ import annotations

from pathlib import Path

BUSY_SHARE = 0.25  # other processes' share of all cores above which a measurement is flagged


def _machine_jiffies() -> tuple[int, int] | None:
    """(busy, total) CPU time of all cores since boot, in clock ticks."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    values = [int(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


def _process_jiffies(pid: int) -> int:
    """User + system time of one process (all its threads), in clock ticks; 0 once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    after_name = text.rsplit(")", 1)[1].split()
    return int(after_name[11]) + int(after_name[12])  # fields 14 and 15 of proc(5): utime, stime


def _families() -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """Every process's children and every session's processes, from each /proc/<pid>/stat's parent and session
    fields."""
    children: dict[int, list[int]] = {}
    sessions: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            parent, session = int(fields[1]), int(fields[3])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
        sessions.setdefault(session, []).append(int(entry.name))
    return children, sessions


def process_tree(roots: list[int]) -> list[int]:
    """``roots`` and every process descended from them or in a session one of them leads (a model server's Ray
    processes: its raylet, workers and replicas are started under the server's own process, in its session, and
    one whose parent ended is still found by its session)."""
    children, sessions = _families()
    seen, stack = [], list(roots)
    while stack:
        pid = stack.pop()
        if pid not in seen:
            seen.append(pid)
            stack.extend(children.get(pid, []))
            if pid in roots:
                stack.extend(sessions.get(pid, []))
    return seen


class LoadSampler:
    """Snapshot before a block, share after it: other processes' fraction of all cores meanwhile. ``trees`` are
    processes whose descendants are ours too, found again at every snapshot (a model server starts workers as it
    goes): a process that started during the block counts all its time as ours, one that ended during it counts
    none of its last time (the kernel keeps no account of it once reaped)."""

    def __init__(self, pids: list[int], trees: list[int] = ()) -> None:
        self.pids, self.trees = list(pids), list(trees)
        self.available = _machine_jiffies() is not None

    def snapshot(self) -> tuple[int, int, dict[int, int]] | None:
        machine = _machine_jiffies()
        if machine is None:
            return None
        pids = set(self.pids) | set(process_tree(self.trees) if self.trees else [])
        return (*machine, {p: _process_jiffies(p) for p in pids})

    def other_share(self, before: tuple[int, int, dict[int, int]] | None) -> float | None:
        after = self.snapshot()
        if before is None or after is None or after[1] <= before[1]:
            return None
        busy, total = after[0] - before[0], after[1] - before[1]
        own = sum(max(0, j - before[2].get(p, 0)) for p, j in after[2].items() if j)
        return min(1.0, max(0.0, (busy - own) / total))


def load_summary(shares: list[float | None]) -> dict | None:
    known = [s for s in shares if s is not None]
    if not known:
        return None
    return {"other_share_mean": round(sum(known) / len(known), 4), "other_share_max": round(max(known), 4),
            "blocks": len(known), "blocks_busy": sum(s > BUSY_SHARE for s in known)}


def busy_machine_flag(entries: list[dict]) -> str | None:
    """A flag for the report when other processes used a substantial share of the cores while measuring."""
    loads = {e["name"]: e.get("machine_load") for e in entries if e.get("machine_load")}
    # the traffic tests (serve_bench.load) too: an absolute p99 under load is the figure a neighbour moves most
    loads.update({f"{e['name']} (under traffic)": (e.get("traffic") or {}).get("machine_load") for e in entries
                  if (e.get("traffic") or {}).get("machine_load")})
    loads.update({f"{e['name']} (through its server)": ((e.get("traffic") or {}).get("served") or {}).get(
        "machine_load") for e in entries if ((e.get("traffic") or {}).get("served") or {}).get("machine_load")})
    busy = {n: l for n, l in loads.items() if l["other_share_mean"] > BUSY_SHARE}
    if not busy:
        return None
    worst = max(busy.values(), key=lambda l: l["other_share_mean"])
    return (f"the machine was busy with other work while measuring: other processes used "
            f"{100 * worst['other_share_mean']:.0f}% of all cores on average during the blocks of "
            f"{', '.join(busy)} (up to {100 * worst['other_share_max']:.0f}% in one block); their latencies include "
            "that interference (ratios measured interleaved are less affected); re-measure on a quiet machine "
            "before trusting the absolute figures")
