"""compress: one pipeline file from training to a gated, benchmarked INT8 deployment."""
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("compress")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+source"
