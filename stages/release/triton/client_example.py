"""The request example a release's card shows: a Python script (tritonclient over HTTP) that sends the engine model a
request at its first profile's opt shape, checked against the profile ranges first (Triton's config cannot say
them: a dimension a profile bounds is -1 there), and, where the release ships the preprocessing, one that sends an
encoded image to the ensemble.

Every value in it (names, shapes) is written with `repr`: a tensor name is anyone's text, and the script must
run as the code it shows. The tests run it against a real Triton server.
"""
from __future__ import annotations

from trtflow.stages.release.triton.config import NUMPY
from trtflow.stages.release.triton.contract import Contract


def script(model: str, contract: Contract, ensemble: str | None = None) -> str:
    first = contract.profiles[0] if contract.profiles else None
    ranges = {t.name: [(p.shapes[t.name][0], p.shapes[t.name][2]) for p in contract.profiles if t.name in p.shapes]
              for t in contract.inputs}
    lines = [
        "import os",
        "import sys",
        "import time",
        "",
        "import numpy as np",
        "import tritonclient.http as httpclient",
        "",
        'client = httpclient.InferenceServerClient(os.environ.get("TRITON_URL", "localhost:8000"))',
        f"MODEL = {model!r}",
        "# per input, the (min, max) shape of each optimization profile: Triton passes any size where its config",
        "# says -1, the engine takes only these",
        f"RANGES = {ranges!r}",
        "",
        "# a server just started loads its models first: wait for this one (at most WAIT seconds)",
        "deadline = time.monotonic() + float(os.environ.get('WAIT', '120'))",
        "while True:",
        "    try:",
        "        if client.is_model_ready(MODEL):",
        "            break",
        "    except Exception:  # not listening yet",
        "        pass",
        "    if time.monotonic() > deadline:",
        "        sys.exit(f'{MODEL} is not ready on the server')",
        "    time.sleep(1)",
        "",
        "",
        "def fits(name, shape):",
        "    return any(len(shape) == len(lo) and all(a <= s <= b for a, s, b in zip(lo, shape, hi))",
        "               for lo, hi in RANGES[name])",
        "",
        "",
        "inputs = []",
    ]
    for t in contract.inputs:
        shape = list(first.shapes[t.name][1]) if first is not None and t.name in first.shapes else \
            ([1] if contract.max_batch_size > 0 else []) + [max(d, 1) for d in t.dims]
        lines += [f"data = np.zeros({shape!r}, dtype=np.{NUMPY.get(t.data_type, 'float32')})"
                  + ("  # the profile's opt shape" if first is not None and t.name in first.shapes else ""),
                  f"assert fits({t.name!r}, data.shape), f'{{data.shape}} is outside the engine\\'s profiles'",
                  f"item = httpclient.InferInput({t.name!r}, list(data.shape), {t.data_type.removeprefix('TYPE_')!r})",
                  "item.set_data_from_numpy(data)",
                  "inputs.append(item)"]
    outputs = [t.name for t in contract.outputs]
    lines += [f"OUTPUTS = {outputs!r}",
              "result = client.infer(MODEL, inputs, outputs=[httpclient.InferRequestedOutput(o) for o in OUTPUTS])",
              "for name in OUTPUTS:",
              "    print(name, result.as_numpy(name).shape)"]
    if ensemble is not None:
        lines += ["",
                  "# the encoded image, preprocessed in Triton as the parity stage checked it",
                  "if len(sys.argv) > 1:",
                  "    with open(sys.argv[1], 'rb') as f:",
                  "        image = np.frombuffer(f.read(), dtype=np.uint8)",
                  "    item = httpclient.InferInput('IMAGE', [len(image)], 'UINT8')",
                  "    item.set_data_from_numpy(image)",
                  f"    result = client.infer({ensemble!r}, [item], "
                  "outputs=[httpclient.InferRequestedOutput(o) for o in OUTPUTS])",
                  "    for name in OUTPUTS:",
                  "        print(name, result.as_numpy(name).shape)"]
    return "\n".join(lines) + "\n"


def started_by(script: str, command: str) -> str:
    """`script` headed by the command that starts the server it talks to, where the model needs one said (plugin
    libraries its engine was built with, loaded by Triton's TensorRT backend)."""
    head = ["# start the server with the engine's TensorRT plugin libraries loaded (from the release's output folder;",
            "# Triton's TensorRT backend loads them, or set LD_PRELOAD to them instead):", f"#   {command}", ""]
    return "\n".join(head) + "\n" + script
