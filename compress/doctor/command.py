"""The ``compress doctor`` subcommand: its arguments and the call, kept beside the checks it runs."""
from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub, console) -> None:
    """Register ``doctor`` on the CLI's subparsers; ``console(stderr)`` makes the CLI's console."""
    doctor = sub.add_parser("doctor", help="check this machine: CPU, runtimes, the defaults' choices, a smoke run",
                            description="Exit 0: every installed runtime passed its smoke run; 3: one failed.")
    doctor.add_argument("--json", metavar="PATH", help="also write the facts as JSON")
    doctor.add_argument("--gpu", action="store_true", help="the GPU check instead: pytest -m gpu, then the "
                        "quickstart with an INT8 TensorRT engine and a cuda bench (exit 0 without a GPU)")
    doctor.set_defaults(func=lambda args: run(args, console(False)))


def run(args: argparse.Namespace, console) -> int:
    from compress.doctor.checkup import DoctorSettings, run_doctor  # the checks import torch: only when asked

    return run_doctor(DoctorSettings(json_path=Path(args.json) if args.json else None, gpu=args.gpu), console)
