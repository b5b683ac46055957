"""Shared pydantic base: camelCase on the wire, snake_case in Python, unknown fields rejected."""

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)

    def to_wire(self) -> dict[str, object]:
        """The camelCase dict as stored in Kubernetes (None fields dropped)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")
