"""A pipeline's data, loaded the one way every process of a run loads it (runner, ranks, joining machines)."""
from __future__ import annotations

from compress.config import DataConfig
from compress.errors import DataInputError
from train.data import DataBundle, DataSpec, load_data
from train.datasets import DataError
from train.tasks import TASKS


def load_section(data: DataConfig, source: str) -> DataBundle:
    """Load (or open the decode cache of) ``data``; a source that cannot be read is an input error naming the file."""
    try:
        spec = DataSpec(**data.model_dump(exclude={"independent_test"}))
        return next((t.load for t in TASKS.values() if spec.name in t.datasets), load_data)(spec)
    except DataError as exc:
        raise DataInputError(f"{source}: data: {exc}") from exc
