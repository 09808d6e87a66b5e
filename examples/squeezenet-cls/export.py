"""Export torchvision's SqueezeNet 1.1 (random weights, seed 0: nothing is downloaded) to models/squeezenet1_1.onnx.

The committed model was made with torch 2.14.1 / torchvision 0.29.1:  python examples/squeezenet-cls/export.py
"""
from pathlib import Path

import torch
import torchvision

torch.manual_seed(0)
model = torchvision.models.squeezenet1_1(weights=None).eval()
out = Path(__file__).parent / "models" / "squeezenet1_1.onnx"
torch.onnx.export(model, torch.randn(1, 3, 224, 224), str(out), input_names=["input"], output_names=["logits"],
                  dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}}, opset_version=17, dynamo=False)
print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB)")
