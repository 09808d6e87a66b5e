"""The base of every model a pipeline file is read into: strict, as a person's file should be read."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict

CUSTOM_KIND = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"  # package.module:function


class Strict(BaseModel):
    # `.inf` and `.nan` are YAML floats: no count, bound or tolerance of trtflow's means anything with them
    # defer_build: a run validates the few kinds its pipeline uses; building every kind's validator at import took
    # 0.37 s of every `trtflow run`, cached ones included
    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False, defer_build=True)
