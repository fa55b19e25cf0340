"""The INT8 ladder's decisions on plain inputs: which rung runs next, which ships, what is recorded."""
from __future__ import annotations

from pathlib import Path

from compress.quantization.flavours import Check
from compress.quantization.ladder import Attempt, RungUnavailable, choose, climb

CPU = Check.own("cpu")


def _attempt(rung: str, drop: float, max_drop: float = 1.0) -> Attempt:
    return Attempt(rung=rung, files={"cpu": Path(f"{rung}.onnx")}, val={CPU: {"top1": 90.0 - drop}},
                   drops={CPU: drop}, within=drop <= max_drop)


def _ladder(drops: dict[str, float], unavailable: str | None = None):
    ran: list[str] = []

    def rung(name: str):
        def run(previous: Attempt | None = None) -> Attempt:
            ran.append(name)
            if name == unavailable:
                raise RungUnavailable("torch.export could not capture the model")
            return _attempt(name, drops[name])
        return run

    return ran, rung("ptq"), [(name, rung(name)) for name in ("fallback", "qat")]


def test_a_passing_ptq_stops_the_climb():
    ran, first, rungs = _ladder({"ptq": 0.4, "fallback": 0.1, "qat": 0.0})
    attempts, climbed = climb(first, rungs, 1.0)
    assert ran == ["ptq"] and climbed == [] and choose(attempts).rung == "ptq"


def test_each_rung_runs_only_after_the_one_before_missed_and_says_why():
    ran, first, rungs = _ladder({"ptq": 3.0, "fallback": 0.8, "qat": 0.0})
    attempts, climbed = climb(first, rungs, 1.0)
    assert ran == ["ptq", "fallback"] and choose(attempts).rung == "fallback"
    assert climbed == ["ptq: cpu drop 3.00 points > red line 1 on the validation split"]


def test_when_every_rung_misses_the_closest_ships_marked_over():
    ran, first, rungs = _ladder({"ptq": 3.0, "fallback": 1.5, "qat": 2.5})
    attempts, climbed = climb(first, rungs, 1.0)
    chosen = choose(attempts)
    assert ran == ["ptq", "fallback", "qat"] and len(climbed) == 2
    assert chosen.rung == "fallback" and not chosen.within  # the gate refuses it later


def test_an_unavailable_rung_is_recorded_and_the_earlier_ones_stand():
    logged: list[str] = []
    ran, first, rungs = _ladder({"ptq": 3.0, "fallback": 2.0}, unavailable="qat")
    attempts, climbed = climb(first, rungs, 1.0, log=logged.append)
    assert [a.rung for a in attempts] == ["ptq", "fallback"] and choose(attempts).rung == "fallback"
    assert climbed[-1] == "qat: could not run: torch.export could not capture the model" and logged


def test_disabled_rungs_are_not_climbed():
    ran, first, rungs = _ladder({"ptq": 3.0, "fallback": 0.5, "qat": 0.0})
    attempts, climbed = climb(first, [r for r in rungs if r[0] == "qat"], 1.0)
    assert ran == ["ptq", "qat"] and choose(attempts).rung == "qat"
