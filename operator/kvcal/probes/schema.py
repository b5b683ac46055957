"""Schema of a probe suite (built in, or a custom one from a ConfigMap): validated with pydantic, clear errors."""

from typing import Literal

from pydantic import Field, model_validator

from kvcal.models.base import Model

ProbeKind = Literal["qa", "arithmetic", "code", "needle"]
# How a reply is scored: 'contains' (the expected words appear, case and punctuation ignored), 'number' (the first
# number in the reply equals the expected one), 'exact' (the reply's first line equals the expected text).
MatchMode = Literal["contains", "number", "exact"]
DEFAULT_MATCH: dict[str, MatchMode] = {
    "qa": "contains",
    "arithmetic": "number",
    "code": "contains",
    "needle": "contains",
}


class Probe(Model):
    id: str = Field(min_length=1, description="Unique within the suite, e.g. 'qa-capital-france'")
    kind: ProbeKind
    prompt: str = Field(min_length=1)
    expected: str = Field(min_length=1, description="The answer the reply must contain (see match)")
    match: MatchMode | None = Field(default=None, description="Default by kind: number for arithmetic, else contains")
    max_tokens: int = Field(default=24, ge=1, le=512)
    context_tokens: int | None = Field(default=None, description="Needle probes: approximate haystack length")

    @property
    def match_mode(self) -> MatchMode:
        return self.match or DEFAULT_MATCH[self.kind]

    @property
    def label(self) -> str:
        """Group label in reports: the kind, with the context length for needle probes ('needle@1024')."""
        return f"{self.kind}@{self.context_tokens}" if self.context_tokens else self.kind


class Suite(Model):
    name: str = Field(min_length=1)
    version: int = 1
    probes: list[Probe] = Field(min_length=1)
    needle_at_served_context: bool = Field(
        default=False,
        description="Also probe a needle at the longest context each run's servers serve (/v1/models max_model_len)",
    )

    @model_validator(mode="after")
    def _unique_ids(self) -> "Suite":
        seen: set[str] = set()
        dupes = sorted({p.id for p in self.probes if p.id in seen or seen.add(p.id)})  # type: ignore[func-returns-value]
        if dupes:
            raise ValueError(f"probes: duplicate ids {', '.join(dupes)}; each probe id must be unique")
        return self
