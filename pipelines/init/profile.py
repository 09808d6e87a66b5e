"""The optimization profile proposed for each input: min / opt / max from the dimensions the model fixes, `--shape`,
and the sample data (the images' sizes, the tensors' shapes); a dynamic batch 1 / 8 / 32. Spatial sizes taken from
images are rounded to the smallest multiple (1, 8, 16, 32, 64) at which ONNX Runtime runs the model."""
from __future__ import annotations

import math
import re
import shlex
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trtflow.errors import SpecError
from trtflow.pipelines.init.data import DataFacts
from trtflow.pipelines.init.model import ModelFacts, Tensor
from trtflow.text import did_you_mean

if TYPE_CHECKING:
    import numpy as np

BATCH = (1, 8, 32)  # a dynamic batch's min / opt / max (opt: fewer when the data has fewer samples)
MULTIPLES = (1, 8, 16, 32, 64)
# one input at the profile's max, its batch included: the engine's buffer for it and what validate and benchmark feed
# it; init itself runs ONNX Runtime on one sample of it (batch 1) to check the sizes it proposes
MAX_INPUT_BYTES = 2**31
OWN_SIZES = ("these are the images' own sizes: where your preprocessing resizes them to a fixed size (a text "
             "recognizer's height, a detector's side), give --shape instead")

Range = tuple[int, int, int]


@dataclass(frozen=True)
class InputProfile:
    tensor: Tensor
    dims: tuple[Range, ...]  # per dimension: min, opt, max
    notes: tuple[str, ...]  # how each dynamic dimension was proposed
    given: bool = False  # by --shape

    def shape(self, point: int) -> list[int]:
        return [d[point] for d in self.dims]

    def flag(self) -> str:
        """Its profile as the --shape flag that gives it."""
        return "--shape " + _shell_word(
            f"{self.tensor.name}=" + "x".join(str(r[0]) if r[0] == r[2] else ":".join(map(str, r)) for r in self.dims))


@dataclass(frozen=True)
class ImageFeed:
    """The input the images feed (NCHW), and the height and width the preprocessing resizes them to (opt)."""
    input: str
    height: int
    width: int
    dtype: str


@dataclass(frozen=True)
class ProfilePlan:
    inputs: tuple[InputProfile, ...]
    image: ImageFeed | None

    def dynamic(self) -> bool:
        return any(r[0] != r[2] for p in self.inputs for r in p.dims)

    def point(self, point: int) -> dict[str, list[int]]:
        """Each input's shape at min (0), opt (1) or max (2)."""
        return {p.tensor.name: p.shape(point) for p in self.inputs}

    def chosen(self) -> str:
        """The dynamic dimensions other than the batch (H, W, a sequence's length...), whose sizes came from the
        data or --shape and the model may not build at, and where they came from: 'H, W of x from the data'; ''
        where there are none."""
        batched = all(p.tensor.rank > 0 and not isinstance(p.tensor.dims[0], int) for p in self.inputs)
        said = []
        for p in self.inputs:
            labels = [_label(p.tensor, i) for i in p.tensor.dynamic() if i > 0 or not batched]
            if labels:
                said.append(f"{', '.join(labels)} of {p.tensor.name} from {'--shape' if p.given else 'the data'}")
        return "; ".join(said)

    def flags(self) -> str:
        """The profile as the --shape flags that give it."""
        return " ".join(p.flag() for p in self.inputs)


@dataclass(frozen=True)
class ShapeArg:
    """One --shape NAME=DIMS: each dimension N (fixed) or MIN:OPT:MAX."""
    name: str
    dims: tuple[Range, ...]


def parse_shape(text: str) -> ShapeArg:
    # the name is everything before the last '=' (a tensor name may hold spaces, '=' or line breaks; dims never do)
    name, eq, spec = text.rpartition("=")
    shown = _shell_word(text)
    bad = SpecError(f"--shape {shown}: expected NAME=DIMS with dimensions joined by 'x', each N or MIN:OPT:MAX",
                    hint="e.g. --shape x=1:8:32x3x48x320")
    if not eq or not name or not spec.strip():
        raise bad
    dims = []
    for part in spec.strip().lower().split("x"):
        values = part.split(":")
        if len(values) not in (1, 3) or not all(v.isdigit() and int(v) > 0 for v in values):
            raise bad
        lo, opt, hi = (int(values[0]),) * 3 if len(values) == 1 else tuple(int(v) for v in values)
        if not lo <= opt <= hi:
            raise SpecError(f"--shape {shown}: {part}: need MIN <= OPT <= MAX", hint="e.g. --shape x=1:8:32x3x48x320")
        dims.append((lo, opt, hi))
    return ShapeArg(name, tuple(dims))


def _shell_word(text: str) -> str:
    """`text` as one shell word on one line: quoted where needed, control characters as bash's $'...' escapes."""
    if text.isprintable():
        return shlex.quote(text)
    return "$'" + text.encode("unicode_escape").decode("ascii").replace("'", "\\'") + "'"


def shape_hint(model: ModelFacts) -> str:
    """The --shape to pass, with the model's fixed dimensions filled in."""
    batch = _batched(model)
    args = []
    for t in model.inputs:
        dims = [str(d) if isinstance(d, int) else ":".join(map(str, BATCH)) if i == 0 and batch else
                f"<{_label(t, i)}>" for i, d in enumerate(t.dims)]
        args.append(f"--shape {_shell_word(f'{t.name}=' + 'x'.join(dims))}")
    return " ".join(args) + " (each dimension N, or MIN:OPT:MAX)"


def _batched(model: ModelFacts) -> bool:
    """Dimension 0 is the batch where every input's first dimension is dynamic (as validate takes it)."""
    return all(t.rank > 0 and not isinstance(t.dims[0], int) for t in model.inputs)


def _label(t: Tensor, i: int) -> str:
    if image_layout(t) and i in (2, 3):
        return "HW"[i - 2]
    d = t.dims[i]
    return d if isinstance(d, str) and d != "?" and re.fullmatch(r"[A-Za-z_]\w*", d) else f"d{i}"


def image_layout(t: Tensor) -> bool:
    """An NCHW image input: rank 4, 1 or 3 channels fixed in dimension 1."""
    return t.rank == 4 and t.dims[1] in (1, 3)


def _nhwc(t: Tensor) -> bool:
    return t.rank == 4 and t.dims[3] in (1, 3) and t.dims[1] not in (1, 3)


def propose(model: ModelFacts, data: DataFacts | None, shapes: list[ShapeArg]) -> ProfilePlan:
    names = [t.name for t in model.inputs]
    given = {}
    for s in shapes:
        if s.name not in names:
            raise SpecError(f"--shape {_shell_word(s.name + '=...')}: the model has no input {s.name!r}"
                            f"{did_you_mean(s.name, names) or ''}", hint=f"its inputs: {', '.join(names)}")
        given[s.name] = s
    image = _image_input(model, data)
    batch = _batched(model)
    spatial = _spatial(image, data) if image is not None and image.name not in given else None
    profiles = []
    for t in model.inputs:
        if t.name in given:
            profiles.append(_given(t, given[t.name]))
            continue
        dims, notes = [], []
        for i, d in enumerate(t.dims):
            if isinstance(d, int):
                dims.append((d, d, d))
            elif i == 0 and batch:
                opt = min(BATCH[1], data.count) if data is not None else BATCH[1]
                dims.append((BATCH[0], opt, BATCH[2]))
                notes.append(f"dimension 0 ({d}), the batch: {BATCH[0]} / {opt} / {BATCH[2]}"
                             + (f" (opt: the data's {data.count} samples)" if opt < BATCH[1] else ""))
            elif spatial is not None and i in spatial.ranges:
                dims.append(spatial.ranges[i])
                notes.append(spatial.notes[i])
            elif data is not None and data.kind == "tensors":
                rng, note = _from_tensors(t, i, data, len(model.inputs) == 1)
                dims.append(rng)
                notes.append(note)
            else:
                why = "" if data is None else f" (--data {data.kind} give no size for it)"
                raise SpecError(f"input '{t.name}' dimension {i} ({d}) is dynamic and nothing says its size{why}",
                                hint=f"give {shape_hint(model)}"
                                     + ("" if data is not None or not image_layout(t) else ", or --data with images"))
        profiles.append(InputProfile(t, tuple(dims), tuple(notes)))
    plan = ProfilePlan(tuple(profiles), None)
    _bounded(plan, batch)
    if spatial is not None and spatial.ranges:
        plan = _rounded(model, plan, image, spatial)
        _bounded(plan, batch)
    if image is not None:
        opt = next(p for p in plan.inputs if p.tensor.name == image.name).shape(1)
        plan = ProfilePlan(plan.inputs, ImageFeed(image.name, opt[2], opt[3], image.dtype))
    return plan


def _image_input(model: ModelFacts, data: DataFacts | None) -> Tensor | None:
    if data is None or data.kind != "images":
        return None
    if len(model.inputs) != 1:
        raise SpecError(f"--data: images feed a model of one input; this one takes "
                        f"{', '.join(t.name for t in model.inputs)}",
                        hint="give --data a glob of .npz files holding an array per input")
    t = model.inputs[0]
    if _nhwc(t):
        raise SpecError(f"--data: input '{t.name}' {t.shown()} takes NHWC images; init writes NCHW preprocessing "
                        f"only", hint="give --data a glob of .npy tensors the model takes as they are")
    if not image_layout(t) or t.dtype not in ("float32", "float16", "uint8"):
        raise SpecError(f"--data: input '{t.name}' {t.shown()} is not an image input (N, 1 or 3 channels, H, W)",
                        hint="give --data a glob of .npy/.npz tensors the model takes")
    if isinstance(t.dims[0], int) and t.dims[0] > 1:
        raise SpecError(f"--data: input '{t.name}' {t.shown()} is pinned to a batch of {t.dims[0]}, and images are "
                        f"fed one at a time (a batch of 1 each): the pipeline could not run",
                        hint=f"export the model with a dynamic batch (torch.onnx.export(..., dynamic_axes={{"
                             f"'{t.name}': {{0: 'batch'}}}})), or give --data a glob of .npy tensors of shape "
                             f"[{', '.join(str(d) for d in t.dims)}]")
    return t


@dataclass(frozen=True)
class _Spatial:
    ranges: dict[int, Range]
    notes: dict[int, str]


def _spread(values: list[int]) -> Range:
    return min(values), statistics.median_low(values), max(values)


def _spatial(t: Tensor, data: DataFacts) -> _Spatial:
    heights = [h for h, _ in data.sizes]
    widths = [w for _, w in data.sizes]
    n = data.count
    h, w = t.dims[2], t.dims[3]
    ranges, notes = {}, {}
    if isinstance(h, int) and not isinstance(w, int):  # a text line's width at the model's height
        widths = [max(1, round(wi * h / hi)) for hi, wi in data.sizes]
        ranges[3] = _spread(widths)
        notes[3] = f"W ({w}): the {n} images' widths at height {h} (aspect kept): smallest / median / largest"
    elif isinstance(w, int) and not isinstance(h, int):
        heights = [max(1, round(hi * w / wi)) for hi, wi in data.sizes]
        ranges[2] = _spread(heights)
        notes[2] = f"H ({h}): the {n} images' heights at width {w} (aspect kept): smallest / median / largest"
    elif not isinstance(h, int):
        ranges[2], ranges[3] = _spread(heights), _spread(widths)
        notes[2] = f"H ({h}): the {n} images' heights: smallest / median / largest"
        notes[3] = f"W ({w}): the {n} images' widths: smallest / median / largest"
    return _Spatial(ranges, notes)


def _round(r: Range, m: int) -> Range:
    lo = max(m, r[0] // m * m)
    opt = max(lo, round(r[1] / m) * m)
    hi = max(opt, -(-r[2] // m) * m)
    return lo, opt, hi


def _rounded(model: ModelFacts, plan: ProfilePlan, image: Tensor, spatial: _Spatial) -> ProfilePlan:
    """The spatial ranges rounded to the smallest multiple at which ONNX Runtime runs the model at min, opt and max
    (a detector's strides want 32); refused naming --shape where none does."""
    session, why = _session(model)
    if session is None:  # cannot check: the rounding a map output (a detector's strides) usually needs
        m = 32 if any(o.rank == 4 for o in model.outputs) else 1
        return _noted(_with(plan, image.name, {i: _round(r, m) for i, r in spatial.ranges.items()}), image.name,
                      f"sizes rounded to multiples of {m}, not checked: ONNX Runtime cannot load the model ({why}); "
                      f"{OWN_SIZES}")
    errors = []
    for m in MULTIPLES:
        candidate = _with(plan, image.name, {i: _round(r, m) for i, r in spatial.ranges.items()})
        _bounded(candidate, _batched(model))  # rounded up: a little larger than the plan checked
        error = _runs(session, candidate)
        if error is None:
            said = "sizes as they are" if m == 1 else f"sizes rounded to multiples of {m}"
            smaller = "" if m == 1 else " (not at smaller multiples)"
            return _noted(candidate, image.name, f"{said}: ONNX Runtime runs the model at min, opt and max{smaller}; "
                                                 f"{OWN_SIZES}")
        errors.append(error)
    p = next(p for p in plan.inputs if p.tensor.name == image.name)
    raise SpecError(f"input '{image.name}': ONNX Runtime runs the model at none of the sizes proposed from the "
                    f"images ({p.shape(0)} .. {p.shape(2)}, rounded to multiples of up to {MULTIPLES[-1]}): "
                    f"{errors[-1]}", hint=f"give {shape_hint(model)}")


def _with(plan: ProfilePlan, name: str, ranges: dict[int, Range]) -> ProfilePlan:
    out = []
    for p in plan.inputs:
        if p.tensor.name == name:
            p = InputProfile(p.tensor, tuple(ranges.get(i, r) for i, r in enumerate(p.dims)), p.notes, p.given)
        out.append(p)
    return ProfilePlan(tuple(out), plan.image)


def _noted(plan: ProfilePlan, name: str, note: str) -> ProfilePlan:
    return ProfilePlan(tuple(InputProfile(p.tensor, p.dims, p.notes + ((note,) if p.tensor.name == name else ()),
                                          p.given) for p in plan.inputs), plan.image)


def _session(model: ModelFacts):  # noqa: ANN202 - an onnxruntime.InferenceSession, or None and why
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4
    try:
        return ort.InferenceSession(str(model.path), options, providers=["CPUExecutionProvider"]), ""
    except Exception as exc:  # noqa: BLE001 - ONNX Runtime raises its own types for every kind of refusal
        return None, str(exc).splitlines()[0][:200]


def _runs(session, plan: ProfilePlan) -> str | None:  # noqa: ANN001
    """None where the model runs at each profile point (batch 1), else ONNX Runtime's first line (or the
    allocation's: each input is under MAX_INPUT_BYTES, checked before)."""
    import numpy as np

    rng = np.random.default_rng(0)
    for point in range(3):
        shapes = {p.tensor.name: [1 if i == 0 and d[0] != d[2] else d[point] for i, d in enumerate(p.dims)]
                  for p in plan.inputs}
        try:  # the feed a temporary: one point's inputs alive at a time
            session.run(None, {p.tensor.name: _random(rng, shapes[p.tensor.name], p.tensor) for p in plan.inputs})
        except Exception as exc:  # noqa: BLE001 - ONNX Runtime's own types, or numpy's MemoryError
            return f"at {', '.join(f'{n} {s}' for n, s in shapes.items())}: {str(exc).splitlines()[0][:200]}"
    return None


def _random(rng: np.random.Generator, shape: list[int], t: Tensor) -> np.ndarray:
    """Uniform [0, 1) floats drawn in float32 (a float64 draw and its copy took three times the input's bytes),
    else zeros."""
    import numpy as np

    if not t.is_float():
        return np.zeros(shape, t.dtype)
    return rng.random(shape, dtype=np.float64 if t.dtype == "float64" else np.float32).astype(t.dtype, copy=False)


def _itemsize(dtype: str) -> int:
    import numpy as np

    try:
        return np.dtype(dtype).itemsize
    except TypeError:  # a type numpy does not name (bfloat16 without ml_dtypes, float8...): counted as the widest
        return 8


def _bounded(plan: ProfilePlan, batched: bool) -> None:
    """Each input's bytes at the profile's max under MAX_INPUT_BYTES, or refused naming it, its max shape and the
    --shape to give: a smaller max batch where one sample fits, else the profile to edit."""
    for p in plan.inputs:
        shape = p.shape(2)
        size = math.prod(shape) * _itemsize(p.tensor.dtype)
        if size <= MAX_INPUT_BYTES:
            continue
        one = size // shape[0]  # one sample's bytes, where dimension 0 is the batch
        if batched and p.dims[0][0] != p.dims[0][2] and one <= MAX_INPUT_BYTES:
            n = MAX_INPUT_BYTES // one
            fits = InputProfile(p.tensor, ((min(p.dims[0][0], n), min(p.dims[0][1], n), n),) + p.dims[1:],
                                p.notes, p.given)
            hint = f"give a smaller max batch, {fits.flag()}, or smaller sizes"
        else:
            hint = f"give --shape with the sizes the model was trained at: edit the profile proposed, {p.flag()}"
        raise SpecError(f"input {p.tensor.name!r} at the profile's max {shape} takes {_gib(size)} "
                        f"({p.tensor.dtype}), over init's limit of {_gib(MAX_INPUT_BYTES)} for one input "
                        f"(MAX_INPUT_BYTES)", hint=hint)


def _gib(size: int) -> str:
    return f"{size / 2**30:.3g} GiB"


def _given(t: Tensor, s: ShapeArg) -> InputProfile:
    if len(s.dims) != t.rank:
        raise SpecError(f"--shape {_shell_word(s.name)}: {len(s.dims)} dimensions, but input {t.name!r} has rank {t.rank} "
                        f"{t.shown()}", hint=f"give {t.rank} dimensions joined by 'x'")
    for i, (d, r) in enumerate(zip(t.dims, s.dims)):
        if isinstance(d, int) and r != (d, d, d):
            raise SpecError(f"--shape {_shell_word(s.name)}: dimension {i} is fixed at {d} in the model, the flag gives "
                            f"{':'.join(map(str, r)) if len(set(r)) > 1 else r[0]}", hint=f"give {d} there")
    return InputProfile(t, s.dims, ("from --shape",), given=True)


def _from_tensors(t: Tensor, i: int, data: DataFacts, single: bool) -> tuple[Range, str]:
    arrays = [s.get(t.name, s.get("") if single else None) for s in data.shapes]
    sizes = [a[i] for a in arrays if a is not None and len(a) == t.rank]
    if not sizes:
        raise SpecError(f"--data: no tensor file holds input '{t.name}' at rank {t.rank} {t.shown()}",
                        hint=".npy for a model of one input, .npz with an array named after each input")
    return _spread(sizes), f"dimension {i} ({t.dims[i]}): the {len(sizes)} tensors' sizes: smallest / median / largest"
