"""The base of every typed `EmbeddingModel` section (spec.py, policy_spec.py): camelCase on the wire,
frozen, and tolerant of fields newer than this operator."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class SpecModel(BaseModel):
    """A section of the spec or status: snake_case here, camelCase on the wire (aliases)."""

    # Unknown fields are ignored, not refused: the API server has already pruned them against the
    # schema, and an operator must not fail on a CRD one version newer than itself.
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)
