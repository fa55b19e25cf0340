"""The training engine's errors. ``bad_input`` says whether the caller gave something unusable
(exit 2 at the command line) or a run failed (exit 3); the stage boundary reads it, so this
package needs to know nothing about the pipeline that maps it."""
from __future__ import annotations


class TrainError(Exception):
    bad_input = False
