"""A STAND-IN for Triton's TensorRT backend, for the tests: a Python-based backend that Triton loads for
`platform: "tensorrt_plan"` (it resolves that platform to a backend directory named `tensorrt`), which runs the
released variant's ONNX (`<version>/model.onnx`, placed beside the engine by the test) on ONNX Runtime's CPU
kernels and refuses, as the engine would, every request whose shapes no optimization profile takes (the release's
`contract.json`). It proves what Triton does with the released repository (config, batching, shapes, ensembles)
and nothing about TensorRT: no engine runs here.

The same file is also A STAND-IN for Triton's ONNX Runtime backend, for the tests: installed as the backend
directory `onnxruntime`, which Triton picks for `platform: "onnxruntime_onnx"` (an offloaded model's ONNX Runtime
pieces, issue #68), it runs the model's own file (`<version>/<default_model_filename>`, `model.onnx` unless the
config names another) on ONNX Runtime's CPU kernels, with no profiles to enforce. It proves what Triton does with
such a model (config, ensembles) and nothing about Triton's real ONNX Runtime backend (its execution providers, its
config auto-completion): that backend does not run here.

Runs in the Triton Python backend's stub, in an environment of its own: numpy and onnxruntime only.
"""
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        model_dir = Path(args["model_repository"])
        self.config = json.loads(args["model_config"])
        if self.config["platform"] == "onnxruntime_onnx":  # the ONNX Runtime stand-in: the model's own file
            self.contract = {"profiles": []}
            onnx = model_dir / args["model_version"] / (self.config.get("default_model_filename") or "model.onnx")
        else:  # the TensorRT stand-in: the ONNX placed beside the engine, the engine's profiles
            self.contract = json.loads((model_dir / "contract.json").read_text())
            onnx = model_dir / args["model_version"] / "model.onnx"
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.session = ort.InferenceSession(str(onnx), options, providers=["CPUExecutionProvider"])
        self.inputs = [i["name"] for i in self.config["input"]]
        self.outputs = [o["name"] for o in self.config["output"]]

    def _refusal(self, shapes):
        reasons = []
        for profile in self.contract["profiles"]:
            why = None
            for name, (lo, _, hi) in profile["shapes"].items():
                shape = shapes.get(name)
                if shape is None:
                    continue
                if len(shape) != len(lo):
                    why = f"input '{name}' has {len(shape)} dimensions, the engine {len(lo)}"
                    break
                bad = [i for i, (a, s, b) in enumerate(zip(lo, shape, hi)) if not a <= s <= b]
                if bad:
                    i = bad[0]
                    why = (f"input '{name}' dimension {i} is {shape[i]}, outside the engine's profile "
                           f"'{profile['name']}' ({lo[i]}..{hi[i]})")
                    break
            if why is None:
                return None
            reasons.append(why)
        return "; ".join(reasons) or None

    def execute(self, requests):
        responses = []
        for request in requests:
            feeds = {name: pb_utils.get_input_tensor_by_name(request, name).as_numpy() for name in self.inputs}
            why = self._refusal({name: list(a.shape) for name, a in feeds.items()})
            if why is not None:
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(why)))
                continue
            results = self.session.run(self.outputs, feeds)
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor(n, np.ascontiguousarray(r)) for n, r in zip(self.outputs, results)]))
        return responses
