"""JSON schema of a pipeline file, with each stage kind's settings, for editor completion."""
from __future__ import annotations

from compress.config import PipelineConfig
from compress.stages import registry


def pipeline_json_schema() -> dict:
    schema = PipelineConfig.model_json_schema()
    stage_schemas = []
    for kind in registry.kinds():
        cls = registry.get(kind)
        assert cls is not None
        sub = cls.Config.model_json_schema()
        schema.setdefault("$defs", {}).update(sub.pop("$defs", {}))
        stage_schemas.append(sub)
    schema["properties"]["stages"]["items"] = {"oneOf": stage_schemas}
    return schema
