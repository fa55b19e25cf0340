"""What a search measures: each contender in a search bench (the baseline, the hand-set result, a trial's
candidate) as a named identity. What it judges by is the hand-set pipeline's ``serve_bench.limits.Limits``.

A contender's bench entry is named ``<label>:<artifact>`` for people reading the report; the
search itself never parses that name back: it keeps the ``Contender`` (stored beside the entry),
so which trial an entry measured is a field, not a prefix.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

from serve_bench.runners import RUNNER_OF_KIND


Role = Literal["baseline", "hand-set", "trial"]
BASELINE, HAND_SET, TRIAL = "baseline", "hand-set", "trial"


@dataclass(frozen=True)
class Contender:
    """One artifact of one run directory, and the part it plays in a search bench."""

    role: Role
    artifact: str  # its name in that run's manifest, e.g. quantize.onnx_cpu
    run_dir: str
    trial: int | None = None  # the trial's number, for role "trial"
    runtime: str | None = None  # an ONNX file's runtime; None: every runtime the bench measures on (or not ONNX)

    def __post_init__(self) -> None:
        if (self.role == TRIAL) != (self.trial is not None):
            raise ValueError(f"a contender of role {self.role!r} {'needs' if self.role == TRIAL else 'has no'} "
                             "trial number")

    @property
    def label(self) -> str:
        return f"trial-{self.trial}" if self.role == TRIAL else self.role

    @property
    def name(self) -> str:
        """The bench entry's name, as people read it in the report (``@runtime`` past onnxruntime, as the bench
        names a file on another runtime)."""
        on = f"@{self.runtime}" if self.runtime not in (None, RUNNER_OF_KIND["onnx"]) else ""
        return f"{self.label}:{self.artifact}{on}"

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Contender":
        return cls(role=data["role"], artifact=data["artifact"], run_dir=data["run_dir"], trial=data.get("trial"),
                   runtime=data.get("runtime"))
