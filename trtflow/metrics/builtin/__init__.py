"""The built-in metrics, one module each (see `trtflow/metrics/contract.py`), found by listing this folder: the
module's name is the key a pipeline declares the metric by, its `METRIC` the declaration's class. The code lock
follows this listing too: each module here is in the key of every kind that computes a metric."""
from __future__ import annotations

import importlib
import pkgutil

from trtflow.metrics.contract import BuiltInMetric


def _found() -> dict[str, type[BuiltInMetric]]:
    found = {}
    for module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        metric = getattr(importlib.import_module(f"{__name__}.{module.name}"), "METRIC", None)
        if not (isinstance(metric, type) and issubclass(metric, BuiltInMetric)):
            raise TypeError(f"trtflow/metrics/builtin/{module.name}.py: METRIC must be its declaration's class, a "
                            f"BuiltInMetric")
        found[module.name] = metric
    return found


BUILT_IN: dict[str, type[BuiltInMetric]] = _found()  # key -> declaration class, in the keys' order
