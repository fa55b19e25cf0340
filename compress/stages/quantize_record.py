"""The quantize stage's record of a file it ships, as the bench reads it: where the file runs, and its red-line check.

The quantize stage checks each INT8 file against the red line on every runtime it may ship on, on the test split,
and the gate must refuse the file on a runtime where that check failed or never ran. That decision crosses a stage
boundary (the manifest's metadata), so it is a typed record here rather than a dict whose keys each side spells:
the writer builds a ``RedLineCheck``, the bench reads it back as one and asks it ``refusal(runtime)``.

Manifests written before this record held the file's own runtime's drop as ``test_drop`` (a number) and the other
runtimes' as ``test_drop_on``; they are read in today's shape, with a warning in the log.
"""
from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from serve_bench.runners import RUNNER_OF_KIND

logger = logging.getLogger(__name__)


class RedLineCheck(BaseModel):
    """A shipped file's red-line check on the test split: whether it held, and the drop on each runtime checked."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    within: bool | None = Field(description="every check of this file held on validation and test; None where the "
                                            "labels are random and nothing is judged")
    test_drop: dict[str, float | None] = Field(description="runtime → points below the reference on the test split")

    def refusal(self, runtime: str, on_test: bool = True) -> str | None:
        """Why the gate must not release the file on ``runtime``; None where the check allows it. ``on_test`` False
        (a search's validation bench): a failure the test split found is not seen there, a runtime never checked
        still is."""
        if self.within is False and on_test:
            return ("the quantize stage found no rung within the red line on every runtime it checked (test drop "
                    + ", ".join(f"{r} {d}" for r, d in self.test_drop.items()) + " points); refused")
        if runtime not in self.test_drop:  # a runtime the check left out: quantized before the check, or without it
            return (f"the quantize stage checked its red line on {', '.join(self.test_drop)} only, not on {runtime} "
                    f"(its runtimes setting); refused here: re-run the quantize stage with {runtime} among its "
                    "runtimes")
        return None


class ShippedFile(BaseModel):
    """What the bench reads of a quantize stage's file in the manifest (the rest of its metadata is kept as is)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    runtimes: list[str] | None = Field(None, description="the runtimes it is made for and checked on, its own first; "
                                                         "None: the ONNX file's default runtime")
    red_line: RedLineCheck | None = None

    @model_validator(mode="before")
    @classmethod
    def _old_shape(cls, data: Any) -> Any:
        red = data.get("red_line") if isinstance(data, dict) else None
        if isinstance(red, dict) and not red:  # no check recorded: nothing to refuse on
            return {**data, "red_line": None}
        if not isinstance(red, dict) or isinstance(red.get("test_drop"), dict):
            return data
        own = (data.get("runtimes") or [RUNNER_OF_KIND["onnx"]])[0]
        logger.warning("a quantized file's red-line check in an older manifest's shape (test_drop and test_drop_on): "
                       "read as the drop on each runtime; re-run the quantize stage to write today's")
        drops = {own: red.get("test_drop"), **(red.get("test_drop_on") or {})}
        return {**data, "red_line": {"within": red.get("within"), "test_drop": drops}}

    def refusal(self, runtime: str, on_test: bool = True) -> str | None:
        """Why the gate must not release this file on ``runtime`` (None: no check recorded, or it allows it)."""
        return self.red_line.refusal(runtime, on_test) if self.red_line is not None else None
