"""The training-time preprocessing, as a function image path -> array: torchvision transforms declared in YAML,
a user's callable, or tensors the training code saved."""
from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from trtflow import phases
from trtflow.artifact import Artifact
from trtflow.errors import StageError
from trtflow.pipelines.params.parity import TrainingRef

TrainingFn = Callable[[Path], np.ndarray]


def build(ref: TrainingRef, tensors: list[Artifact], images: list[Artifact]) -> tuple[TrainingFn, str]:
    """The reference function and a label saying what produced it."""
    if ref.torchvision is not None:
        return _torchvision(ref.torchvision)
    if ref.callable is not None:
        return _callable(ref.callable)
    return _tensors(tensors, images)


@phases.timed("training transforms: torchvision imported")
def _torchvision(specs: list[str]) -> tuple[TrainingFn, str]:
    try:
        import torchvision
        from PIL import Image
        from torchvision import transforms as T
    except ImportError:
        raise StageError("training.torchvision needs torchvision and Pillow: pip install torchvision") from None
    steps = [_parse_transform(s, T) for s in specs]
    compose = T.Compose(steps)

    @phases.timed("training transforms: run (torchvision on PIL)")
    def apply(path: Path) -> np.ndarray:
        try:
            with Image.open(path) as im:
                image = im.convert("RGB")  # what torchvision's ImageFolder loader does
        except Exception as exc:  # noqa: BLE001 - PIL raises many types for bad files
            raise StageError(f"cannot read image {path} with PIL: {exc}") from None
        out = compose(image)
        return out.numpy() if hasattr(out, "numpy") else np.asarray(out)

    return apply, f"torchvision {torchvision.__version__} (PIL)"


def _parse_transform(text: str, T: Any) -> Any:
    """'Resize(256, interpolation=InterpolationMode.BICUBIC)' -> the transform; literals only, nothing evaluated."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        raise StageError(f"training.torchvision: cannot parse {text!r} (expected e.g. Resize(256))") from None
    if isinstance(node, ast.Name):
        node = ast.Call(func=node, args=[], keywords=[])
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise StageError(f"training.torchvision: {text!r} is not a transform call like CenterCrop(224)")
    name = node.func.id
    cls = getattr(T, name, None)
    if cls is None or not isinstance(cls, type):
        from trtflow.text import did_you_mean
        names = [n for n in dir(T) if n[:1].isupper()]
        raise StageError(f"training.torchvision: unknown transform '{name}'{did_you_mean(name, names)}")

    def value(v: ast.AST) -> Any:
        if isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name) and v.value.id == "InterpolationMode":
            return getattr(T.InterpolationMode, v.attr)
        try:
            return ast.literal_eval(v)
        except ValueError:
            raise StageError(f"training.torchvision: {text!r}: only literals and InterpolationMode.X are "
                             f"allowed as arguments") from None

    try:
        return cls(*[value(a) for a in node.args], **{k.arg: value(k.value) for k in node.keywords})
    except TypeError as exc:
        raise StageError(f"training.torchvision: {text!r}: {exc}") from None


def _callable(ref: str) -> tuple[TrainingFn, str]:
    from trtflow.usercode import import_callable

    func = import_callable(ref, "training.callable", 1)  # f(path) -> array

    def apply(path: Path) -> np.ndarray:
        try:
            out = func(str(path))
        except Exception as exc:  # noqa: BLE001 - the user's code
            raise StageError(f"training.callable {ref} raised {type(exc).__name__} on {path.name}: {exc}") from None
        if hasattr(out, "detach"):
            out = out.detach().cpu().numpy()
        return np.asarray(out)

    return apply, f"callable {ref}"


def _tensors(tensors: list[Artifact], images: list[Artifact]) -> tuple[TrainingFn, str]:
    by_stem: dict[str, Path] = {}
    for t in tensors:
        if t.path.suffix not in (".npy", ".npz"):
            raise StageError(f"training.tensors: {t.path.name} is not a .npy or .npz file")
        by_stem[t.path.stem] = t.path
    missing = [i.path.name for i in images if i.path.stem not in by_stem]
    if missing or len(by_stem) != len(images):
        raise StageError(f"training.tensors: {len(by_stem)} tensor file(s) for {len(images)} image(s); "
                         f"each image needs <image stem>.npy or .npz"
                         + (f" (missing for {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''})"
                            if missing else ""))

    def apply(path: Path) -> np.ndarray:
        f = by_stem[path.stem]
        try:
            data = np.load(f)
            if isinstance(data, np.lib.npyio.NpzFile):
                if len(data.files) != 1:
                    raise StageError(f"training.tensors: {f.name} holds {len(data.files)} arrays; save one")
                return data[data.files[0]]
            return data
        except (OSError, ValueError) as exc:
            raise StageError(f"training.tensors: cannot load {f.name}: {exc}") from None

    return apply, "tensors saved by the training code"
