"""Load and run a model once in ONNX Runtime, in a child process (`trtflow.child`'s convention).

ONNX Runtime's CPU provider can crash (SIGSEGV) on graphs it should reject, e.g. an FP16 LSTM; in the stage's own
process that would end the pipeline. The child answers with ONNX Runtime's error, if any.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from pydantic import BaseModel

from trtflow import child, phases
from trtflow.errors import TransientStageError

TIMEOUT_S = 900


class ProbeRequest(BaseModel):
    model: str
    feed: str  # an .npz of the inputs by name


class ProbeResponse(BaseModel):
    ok: bool
    error: str | None = None


class ProbeFailed(Exception):
    """ONNX Runtime rejected the model or crashed on it; the message is its error, or says it crashed."""


@phases.timed("ONNX Runtime probe (a child process: a crash there is not the stage's)")
def probe(model: Path, feed: dict[str, np.ndarray], work: Path) -> None:
    feed_path = work / "probe_feed.npz"
    np.savez(feed_path, **feed)
    outcome = child.call("trtflow.stages.ort.probe", ProbeRequest(model=str(model), feed=str(feed_path)),
                         ProbeResponse, work, TIMEOUT_S, names=("probe.json", "probe.response.json"),
                         what="the ONNX Runtime probe")  # killed from outside: `call` raised (not the model's doing)
    if isinstance(outcome, child.TimedOut):
        raise TransientStageError(f"the ONNX Runtime probe did not load and run the model within {TIMEOUT_S} s "
                                  f"(killed); that says nothing about the model: run again")
    if isinstance(outcome, child.Crashed):
        raise ProbeFailed(f"ONNX Runtime crashed loading or running the model (its process {outcome.text()})")
    if not outcome.response.ok:
        raise ProbeFailed(outcome.response.error or "ONNX Runtime failed")


def _main(request: ProbeRequest, folder: Path) -> ProbeResponse:
    from trtflow.stages.ort.runner import session
    from trtflow.stages.ort.runner import whole as run  # one run in a process of its own: no budget to plan by

    try:
        sess = session(Path(request.model))
        feed = dict(np.load(request.feed))
        types = {i.name: i.type for i in sess.get_inputs()}
        run(sess, {k: v.astype(np.float16) if types.get(k) == "tensor(float16)" else v for k, v in feed.items()
                   if k in types})
        return ProbeResponse(ok=True)
    except Exception as exc:  # noqa: BLE001 - ONNX Runtime raises its own exception types
        return ProbeResponse(ok=False, error=str(exc))


if __name__ == "__main__":
    raise SystemExit(child.serve(ProbeRequest, _main))
