"""What a search measures and judges by: each contender in a search bench (the baseline, the hand-set
result, a trial's candidate) as a named identity, and the hand-set pipeline's limits.

A contender's bench entry is named ``<label>:<artifact>`` for people reading the report; the
search itself never parses that name back: it keeps the ``Contender`` (stored beside the entry),
so which trial an entry measured is a field, not a prefix.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

from compress.pipeline.pipeline_file import Pipeline

Role = Literal["baseline", "hand-set", "trial"]
BASELINE, HAND_SET, TRIAL = "baseline", "hand-set", "trial"


@dataclass(frozen=True)
class Contender:
    """One artifact of one run directory, and the part it plays in a search bench."""

    role: Role
    artifact: str  # its name in that run's manifest, e.g. quantize.onnx_cpu
    run_dir: str
    trial: int | None = None  # the trial's number, for role "trial"

    def __post_init__(self) -> None:
        if (self.role == TRIAL) != (self.trial is not None):
            raise ValueError(f"a contender of role {self.role!r} {'needs' if self.role == TRIAL else 'has no'} "
                             "trial number")

    @property
    def label(self) -> str:
        return f"trial-{self.trial}" if self.role == TRIAL else self.role

    @property
    def name(self) -> str:
        """The bench entry's name, as people read it in the report."""
        return f"{self.label}:{self.artifact}"

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Contender":
        return cls(role=data["role"], artifact=data["artifact"], run_dir=data["run_dir"], trial=data.get("trial"))


@dataclass(frozen=True)
class Limits:
    """The hand-set pipeline's limits: what every trial and the final gate are judged against.

    A search is keyed on them: a search directory judged under other limits is not continued
    (its trials were built and scored for those), and a final bench judged under other limits
    is not reused.
    """

    metric: str
    max_drop: float  # points below the baseline (red_line.max_drop)
    p99_budget_ms: float | None  # latency.p99_budget_ms
    decision: str  # gate.decision: point | confident

    @classmethod
    def of(cls, pipeline: Pipeline) -> "Limits":
        config = pipeline.config
        return cls(metric=config.red_line.metric, max_drop=config.red_line.max_drop,
                   p99_budget_ms=config.latency.p99_budget_ms, decision=config.gate.decision)

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
