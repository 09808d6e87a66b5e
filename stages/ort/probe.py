"""Load and run a model once in ONNX Runtime, in a child process: `python -m trtflow.stages.ort.probe MODEL FEED`.

ONNX Runtime's CPU provider can crash (SIGSEGV) on graphs it should reject, e.g. an FP16 LSTM; in the stage's own
process that would end the pipeline. The child prints ONNX Runtime's error, if any, as JSON.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np

from trtflow.child import run_module
from trtflow.errors import TransientStageError

TIMEOUT_S = 900
# How a process ends when something outside kills it. SIGSEGV, SIGABRT, SIGBUS, SIGFPE and SIGILL are ONNX Runtime
# crashing on the graph: evidence that it cannot run it.
KILLED = {signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT}


class ProbeFailed(Exception):
    """ONNX Runtime rejected the model or crashed on it; the message is its error, or says it crashed."""


def probe(model: Path, feed: dict[str, np.ndarray], work: Path) -> None:
    feed_path = work / "probe_feed.npz"
    np.savez(feed_path, **feed)
    try:
        result, proc = run_module("trtflow.stages.ort.probe", [str(model), str(feed_path)], TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise TransientStageError(f"the ONNX Runtime probe did not load and run the model within {TIMEOUT_S} s "
                                  f"(killed); that says nothing about the model: run again") from None
    if proc.returncode == 0 and result and result["ok"]:
        return
    if -proc.returncode in KILLED:  # killed from outside (the OOM killer, a user, a scheduler): not the model's doing
        raise TransientStageError(f"the ONNX Runtime probe was killed ({signal.Signals(-proc.returncode).name}); "
                                  f"that says nothing about the model: run again")
    if result:
        raise ProbeFailed(result["error"])
    raise ProbeFailed(f"ONNX Runtime crashed loading or running the model (exit code {proc.returncode})")


def _main(model: str, feed_path: str) -> dict:
    from trtflow.stages.ort.runner import run, session

    try:
        sess = session(Path(model))
        feed = dict(np.load(feed_path))
        types = {i.name: i.type for i in sess.get_inputs()}
        run(sess, {k: v.astype(np.float16) if types.get(k) == "tensor(float16)" else v for k, v in feed.items()
                   if k in types})
        return {"ok": True}
    except Exception as exc:  # noqa: BLE001 - ONNX Runtime raises its own exception types
        return {"ok": False, "error": str(exc)}


if __name__ == "__main__":
    print(json.dumps(_main(sys.argv[1], sys.argv[2])))
