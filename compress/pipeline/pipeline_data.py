"""A pipeline's data, loaded the one way every process of a run loads it (runner, ranks, joining machines)."""
from __future__ import annotations

from compress.config import DataConfig
from compress.errors import DataInputError
from train.data import DataBundle, DataSpec, load_data
from train.datasets import DataError


def load_section(data: DataConfig, source: str) -> DataBundle:
    """Load (or open the decode cache of) ``data``; a source that cannot be read is an input error naming the file."""
    try:
        return load_data(DataSpec(**data.model_dump(exclude={"independent_test"})))
    except DataError as exc:
        raise DataInputError(f"{source}: data: {exc}") from exc
