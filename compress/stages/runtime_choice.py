"""Which runtimes a stage runs ONNX files on: the ones a pipeline names, each checked usable here, else every
usable one. The bench measures each file on them and the quantize ladder checks the CPU file's accuracy on them,
from this one rule, so the runtime a file is released on is always one its red line was checked on."""
from __future__ import annotations

from compress.errors import ConfigError
from serve_bench.runners import runtime_status, usable_onnx_runtimes


def onnx_runtimes(requested: list[str] | None, device: str, field: str) -> list[str]:
    """``requested`` in its order (the first keeps a file's own name in the bench), or every usable one."""
    if requested is None:
        return usable_onnx_runtimes(device)
    status = runtime_status(device)
    for runtime in requested:
        if status.get(runtime):
            raise ConfigError(f"{field}: {runtime} cannot run here ({status[runtime]}); install it or leave it out "
                              f"(usable here: {', '.join(usable_onnx_runtimes(device)) or 'none'})")
    return list(dict.fromkeys(requested))
