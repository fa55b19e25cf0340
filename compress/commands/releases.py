"""``compress release | verify | serve | images``: ship what the gate released: the bundle, its verification, the
file served on a model server, a split as image files.

Each command registers itself (``add_parsers``); the heavy imports are inside the commands, so
``compress --help`` stays fast."""
from __future__ import annotations

import argparse
from pathlib import Path

from compress.commands.common import console


def _cmd_release(args: argparse.Namespace) -> int:
    from compress.release.bundle import make_release
    from compress.release.console_view import print_release

    release = make_release(Path(args.run_dir), Path(args.to), anyway=args.anyway, artifact=args.artifact)
    print_release(release, console(stderr=False))
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from compress.release.console_view import print_verification
    from compress.release.verify import verify_bundle

    result = verify_bundle(Path(args.bundle), Path(args.images) if args.images else None, threads=args.threads)
    print_verification(result, args.bundle, console(stderr=False))
    return 0 if result.ok else 1


def _cmd_images(args: argparse.Namespace) -> int:
    from compress.release.split_images import write_run_split

    count = write_run_split(Path(args.run_dir), args.split, Path(args.to))
    print(f"wrote the {count} images of the {args.split} split to {args.to} (one folder per class)")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from compress.release.serving import served_target
    from serve_bench.servers.registry import serve_until_stopped

    target = served_target(Path(args.target), args.artifact)
    return serve_until_stopped(target.file, target.runtime, target.settings, model=target.model, host=args.host,
                               port=args.port, runner_options=target.runner_options, source=target.source,
                               say=print)


def add_parsers(sub) -> None:
    release = sub.add_parser("release", help="bundle the released artifact with its model card and checksums",
                             description="Copies the artifact the run's release gate released (and the TensorRT "
                                         "engines of the same model that the bench measured and the gate passes), "
                                         "the report, the resolved pipeline, MODEL_CARD.md, model_card.json and "
                                         "SHA256SUMS into a new folder. Exit 1 (nothing written) when the gate did "
                                         "not release it, unless --anyway; exit 2 (nothing written, --anyway or "
                                         "not) when the file is not the one the report's bench measured.")
    release.add_argument("run_dir")
    release.add_argument("--to", required=True, help="the bundle folder (new, or empty)")
    release.add_argument("--anyway", action="store_true", help="bundle even where the gate said no (marked so)")
    release.add_argument("--artifact", help="with --anyway: this artifact instead of the fastest measured one")
    release.set_defaults(func=_cmd_release)

    verify = sub.add_parser("verify", help="check a release bundle: digests, the file loads, the card's accuracy",
                            description="Exit 0: every check asked for was made and held; 1: one failed, or could "
                                        "not be made here (a TensorRT engine without TensorRT or its GPU, and then "
                                        "its accuracy); 2: invalid input. On images other than the card's own, the "
                                        "99%% interval of the difference of the two accuracies must contain 0.")
    verify.add_argument("bundle")
    verify.add_argument("images", nargs="?", help="a folder of labelled images (one sub-folder per class) to "
                                                  "reproduce the card's accuracy on, e.g. from compress images")
    verify.add_argument("--threads", type=int, help="inference threads (default: physical cores)")
    verify.set_defaults(func=_cmd_verify)

    serve = sub.add_parser("serve", help="serve the released file on a model server, as it was measured",
                           description="Starts the file the run's gate released (or --artifact), or a bundle's file, "
                                       "on Ray Serve with the serving settings the bench measured (largest batch, "
                                       "queue delay, model copies, threads, queue limit), on 127.0.0.1 unless "
                                       "--host says otherwise. Health: GET /-/healthz; the model: GET /MODEL; "
                                       "answers: POST /MODEL/infer. Stops cleanly on Ctrl-C or SIGTERM. Exit 2: a "
                                       "bundle whose checksums fail, or a file no server here runs.")
    serve.add_argument("target", help="a run directory or a release bundle")
    serve.add_argument("--artifact", help="a run's file other than the released one")
    serve.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1: this "
                                                           "machine only; another address exposes the model there)")
    serve.add_argument("--port", type=int, default=8000, help="the HTTP port (default 8000)")
    serve.set_defaults(func=_cmd_serve)

    images = sub.add_parser("images", help="write a split of a run's data as image files, one folder per class")
    images.add_argument("run_dir")
    images.add_argument("--split", choices=["train", "val", "calib", "test"], default="test")
    images.add_argument("--to", required=True, help="a new folder")
    images.set_defaults(func=_cmd_images)
