"""How a metric's name is read, from the declarations (`builtin/`): which way it is better, whether the release
weighs it, validate's default bound."""
from __future__ import annotations

from trtflow.metrics.builtin import BUILT_IN
from trtflow.metrics.builtin.topk import TopKMetric
from trtflow.metrics.contract import Gives

# the elementwise metrics every output gets
ELEMENTWISE: dict[str, Gives] = {"cosine": Gives(True), "max_abs": Gives(False), "mean_abs": Gives(False),
                                 "max_rel": Gives(False), "rtol": Gives(False)}
_GIVEN: dict[str, Gives] = {**ELEMENTWISE, **{n: g for cls in BUILT_IN.values() for n, g in cls.GIVES.items()}}


def gives(name: str) -> Gives | None:
    """How a metric name trtflow gives is read; None for a name that is not trtflow's (a function's)."""
    if name in _GIVEN:
        return _GIVEN[name]
    return Gives(True) if TopKMetric.NAMED.fullmatch(name) else None


def metric_direction(name: str) -> bool | None:
    """True: a metric of trtflow's that must be at least its bound; False: at most; None: not trtflow's."""
    given = gives(name)
    return None if given is None else given.higher


def not_weighed(name: str) -> bool:
    """A metric of trtflow's the release's max_accuracy_drop never weighs (a worst item's, decibels, an error in
    the output's units): validate's tolerances bound it."""
    given = gives(name)
    return given is not None and not given.weighed


def shares_first(bounds: dict[str, tuple[float, bool]]) -> dict[str, tuple[float, bool]]:
    """Bounds with the shares first, in their order otherwise: a failure names the first bound missed (a one-class
    score's agreement before its error)."""
    return dict(sorted(bounds.items(), key=lambda item: not_weighed(item[0])))


def examples() -> dict[str, str]:
    """Each name a built-in metric gives -> the declaration that gives it, for a hint."""
    return {name: given.example for cls in BUILT_IN.values() for name, given in cls.GIVES.items()}
