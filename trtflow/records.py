"""The base of records trtflow stores and reads back (manifests, cache keys, build records, reports): typed, and
written exactly as they were given, so a record an older or later trtflow wrote survives a round trip byte for
byte and a digest taken over it does not move."""
from __future__ import annotations

from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
)


class Recorded(BaseModel):
    """A part of a stored record, read back and written as it was given: a field it was not given (one a record
    of an older trtflow lacks, an optional one left out) stays out of the JSON; one given as null stays in, also
    when the record holding it is written without its own null fields (`exclude_none`, which a dict in its place
    never lost them to); fields a later trtflow adds survive."""
    model_config = ConfigDict(extra="allow")

    @model_serializer(mode="wrap")
    def _as_given(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        out = handler(self)
        extra = self.model_extra or {}
        excluded = info.exclude or ()
        given = {}
        for name in (*type(self).model_fields, *extra):
            if name not in self.model_fields_set and name not in extra:
                continue
            if name in out:
                given[name] = out[name]
            elif info.exclude_none and name not in excluded and getattr(self, name) is None:
                given[name] = None
        return given


def first_problem(exc: ValidationError, *root: str) -> str:
    """'where: what' for the first thing a record's model refused (`root`: the names above the model's own)."""
    err = exc.errors()[0]
    return f"{'.'.join(map(str, (*root, *err['loc']))) or 'the record'}: {err['msg']}"
