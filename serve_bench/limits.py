"""The limits a release is judged against, under the names the pipeline file gives them.

``red_line.metric`` and ``red_line.max_drop``, ``latency.p99_budget_ms`` and ``gate.decision`` travel
as one value from the pipeline file through the bench to the gate, the search and the release, so
no layer renames or unpacks them by hand (a red line that arrives as a loose argument is one that
a caller can forget to pass). The report's gate records them under the same names.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

DECISIONS: tuple[str, ...] = ("point", "confident")


@dataclass(frozen=True, kw_only=True)
class Limits:
    """``max_drop``: points of ``metric`` below the baseline (red_line.max_drop); ``p99_budget_ms``: the p99
    budget (latency.p99_budget_ms; None: none); ``decision``: point | confident (gate.decision)."""

    metric: str = "top1"
    max_drop: float
    p99_budget_ms: float | None = None
    decision: str = "point"

    def __post_init__(self) -> None:
        if self.decision not in DECISIONS:
            raise ValueError(f"decision {self.decision!r}: choose one of {', '.join(DECISIONS)}")

    @classmethod
    def from_dict(cls, data: dict) -> "Limits":
        return cls(**{k: data[k] for k in ("metric", "max_drop", "p99_budget_ms", "decision") if k in data})

    def replace(self, **changes) -> "Limits":
        """These limits with some changed (``None`` values keep the current one): what ``compress gate``'s
        overrides make."""
        return Limits(**{**asdict(self), **{k: v for k, v in changes.items() if v is not None}})

    def as_dict(self) -> dict:
        return asdict(self)

    def words(self) -> str:
        budget = "none" if self.p99_budget_ms is None else f"{self.p99_budget_ms:g} ms"
        return (f"red_line {self.max_drop:g} points ({self.metric}), latency.p99_budget_ms {budget}, "
                f"gate.decision {self.decision}")

    def drop_miss(self, drop: float) -> float:
        """How far a drop (points) misses the red line, relative to the red line (1 point where the line is 0):
        ≤ 0 within. Relative, so a drop miss and a p99 miss add up on one scale."""
        return (drop - self.max_drop) / (self.max_drop if self.max_drop > 0 else 1.0)

    def p99_miss(self, p99_ms: float | None) -> float:
        """How far a p99 (ms) misses the budget, relative to the budget: ≤ 0 within (0 without a budget)."""
        if self.p99_budget_ms is None or p99_ms is None:
            return 0.0
        return (p99_ms - self.p99_budget_ms) / self.p99_budget_ms
