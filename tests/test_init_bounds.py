"""`trtflow init --data` bounded (issue #49): image sizes and tensor shapes come from their headers, nothing decoded
or loaded; an image over MAX_PIXELS, a tensor over MAX_ELEMENTS, a broken or foreign file, and a profile whose input
would take more than MAX_INPUT_BYTES at its max are each refused with one line naming the file (or the input) and
what to do, before anything that size is allocated."""
from __future__ import annotations

import struct
import tracemalloc
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from tests.assets import EXAMPLES, trtflow
from trtflow.errors import SpecError, StageError
from trtflow.pipelines.init import profile as profile_module
from trtflow.pipelines.init.data import MAX_ELEMENTS, MAX_PIXELS, read_data
from trtflow.pipelines.init.model import ModelFacts, Tensor
from trtflow.pipelines.init.profile import MAX_INPUT_BYTES, parse_shape, propose
from trtflow.stages.image.preprocess import decode_image, read_image

DETECTOR = EXAMPLES / "ppocr-det" / "models" / "ch_PP-OCRv4_det_infer.onnx"  # batch, 3, H, W: all but 3 dynamic


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _png(path: Path, width: int, height: int, idat: bytes | None = None, gray: bool = False) -> Path:
    """A PNG whose header declares width x height; its pixels a tiny stream unless `idat` is given."""
    header = struct.pack(">IIBBBBB", width, height, 8, 0 if gray else 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header)
                     + _chunk(b"IDAT", idat if idat is not None else zlib.compress(b"\0" * 64))
                     + _chunk(b"IEND", b""))
    return path


def _zeros(path: Path, width: int, height: int) -> Path:
    """A valid gray PNG of zeros: a decompression bomb (a few hundred KB that decode to width x height bytes)."""
    z = zlib.compressobj(9)
    row = b"\0" * (width + 1)  # filter byte, then the row
    return _png(path, width, height, b"".join(z.compress(row) for _ in range(height)) + z.flush(), gray=True)


def _refused(what: str, spec: str, cwd: Path) -> str:
    with pytest.raises(SpecError) as caught:
        read_data(spec, cwd)
    line = str(caught.value)
    assert "\n" not in line and what in line, line
    return line


def _one_line_refusal(proc) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


# --- images: read from their headers ----------------------------------------------------------------------------

def test_a_png_declaring_60000x60000_is_refused_in_one_line_naming_the_file_and_the_limit(tmp_path):
    """What `cv2.imread` raised as a `cv2.error` (over OpenCV's own 2**30 pixels): exit 1, reported as unexpected."""
    (tmp_path / "data").mkdir()
    cv2.imwrite(str(tmp_path / "data" / "a.png"), np.zeros((64, 96, 3), np.uint8))
    _png(tmp_path / "data" / "huge.png", 60000, 60000)
    proc = trtflow("init", str(DETECTOR), "--data", "data", "-o", "p.yaml", cwd=tmp_path)
    line = _one_line_refusal(proc)
    assert str(tmp_path / "data" / "huge.png") in line and f"{MAX_PIXELS:,} (MAX_PIXELS)" in line, line
    assert "--data" in line
    assert not (tmp_path / "p.yaml").exists()


@pytest.mark.slow
@pytest.mark.parametrize("side", [32000, 12000])
def test_an_image_over_the_pixel_limit_is_refused_from_its_header(tmp_path, side):
    """32000x32000 (decoded whole before, 1 GB, to learn its size) and 12000x12000 (under Pillow's own refusal, so
    its size is said): refused from the header, naming the file and the limit; a real stream of zeros, never
    inflated (the few hundred KB of the file are all that is read)."""
    (tmp_path / "data").mkdir()
    _zeros(tmp_path / "data" / "bomb.png", side, side)
    tracemalloc.start()
    try:
        line = _refused("bomb.png", "data", tmp_path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert f"init's limit of {MAX_PIXELS:,} (MAX_PIXELS)" in line and "resize it" in line, line
    if side * side < 2 * Image.MAX_IMAGE_PIXELS:
        assert f"is {side}x{side} pixels ({side * side:,})" in line, line
    assert peak < 16 * 2**20, peak


def test_broken_and_foreign_files_are_refused_naming_the_file(tmp_path):
    good = tmp_path / "good.png"
    cv2.imwrite(str(good), np.random.default_rng(0).integers(0, 255, (64, 96, 3), np.uint8))
    data = good.read_bytes()
    (tmp_path / "truncated").mkdir()
    (tmp_path / "truncated" / "cut.png").write_bytes(data[: len(data) // 2])
    _refused("cut.png is a broken image", "truncated/*.png", tmp_path)
    (tmp_path / "damaged").mkdir()
    idat = data.index(b"IDAT") + 8
    (tmp_path / "damaged" / "flip.png").write_bytes(data[:idat] + bytes([data[idat] ^ 0xFF]) + data[idat + 1:])
    _refused("flip.png is a broken image", "damaged/*.png", tmp_path)
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "notes.png").write_text("not an image\n")
    line = _refused("notes.png is not an image", "text/*.png", tmp_path)
    assert "give --data a glob that leaves it out" in line


def test_a_png_is_checked_through_iend_in_blocks(tmp_path):
    """A valid PNG of noise (one 12 MB IDAT chunk) is read whole for its CRCs, never held whole (Pillow's verify()
    reads each chunk into memory at once) nor inflated."""
    (tmp_path / "data").mkdir()
    noise = np.random.default_rng(2).integers(0, 255, (2000, 6001), np.uint8)
    noise[:, 0] = 0  # each row's filter byte: none
    _png(tmp_path / "data" / "noise.png", 2000, 2000, zlib.compress(noise.tobytes(), 1))
    tracemalloc.start()
    try:
        assert read_data("data", tmp_path).sizes == ((2000, 2000),)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20, peak
    assert read_image(tmp_path / "data" / "noise.png").shape == (2000, 2000, 3)  # the stages decode it


def test_sizes_are_the_ones_the_stages_decode_exif_turn_included(tmp_path):
    """A phone photo stored landscape with EXIF orientation 6 is portrait as the stages read it (OpenCV applies the
    orientation): init's sizes are theirs, from the header."""
    pixels = np.random.default_rng(1).integers(0, 255, (40, 60, 3), np.uint8)
    turned = Image.Exif()
    turned[0x0112] = 6
    (tmp_path / "data").mkdir()
    for name, exif in (("plain.jpg", None), ("turned.jpg", turned), ("turned.png", turned), ("turned.webp", turned)):
        Image.fromarray(pixels).save(tmp_path / "data" / name, **({"exif": exif.tobytes()} if exif else {}))
    for name in ("plain.jpg", "turned.jpg", "turned.png", "turned.webp"):
        facts = read_data("data/" + name.replace(".", "*."), tmp_path)
        assert facts.sizes == (read_image(tmp_path / "data" / name).shape[:2],), name
    assert read_data("data/turned*.jpg", tmp_path).sizes == ((60, 40),)


def test_the_stages_refuse_an_image_over_opencvs_limit_as_a_stage_error(tmp_path):
    """The stages decode with OpenCV, which raises (not returns None) over its own pixel limit: one StageError
    naming the file, not a cv2.error reported as a bug."""
    huge = _png(tmp_path / "huge.png", 60000, 60000)
    with pytest.raises(StageError, match=r"cannot read image .*huge\.png: OpenCV refuses it: more pixels than"):
        read_image(huge)
    with pytest.raises(StageError, match=r"cannot decode the image \(\d+ bytes\): OpenCV refuses it"):
        decode_image(huge.read_bytes())


# --- tensors: shapes from their headers -------------------------------------------------------------------------

def test_tensor_shapes_come_from_headers_without_loading(tmp_path):
    """A compressed .npz of a 64 MB array gives its shape without inflating it; a .npy whose header declares more
    than MAX_ELEMENTS, a truncated .npy, an array of objects and a broken zip are refused naming the file."""
    (tmp_path / "npz").mkdir()
    np.savez_compressed(tmp_path / "npz" / "a.npz", x=np.zeros((1, 4, 2048, 2048), np.float32))
    tracemalloc.start()
    try:
        facts = read_data("npz", tmp_path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert facts.shapes == ({"x": (1, 4, 2048, 2048)},)
    assert peak < 4 * 2**20, peak

    (tmp_path / "big").mkdir()
    with open(tmp_path / "big" / "big.npy", "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (1, 3, 60000, 60000)})
    line = _refused("big.npy is [1, 3, 60000, 60000]", "big", tmp_path)
    assert f"over init's limit of {MAX_ELEMENTS:,} (MAX_ELEMENTS)" in line

    (tmp_path / "cut").mkdir()
    np.save(tmp_path / "cut" / "cut.npy", np.zeros((1, 3, 48, 100), np.float32))
    whole = (tmp_path / "cut" / "cut.npy").read_bytes()
    (tmp_path / "cut" / "cut.npy").write_bytes(whole[:1000])
    _refused("cut.npy is truncated", "cut", tmp_path)

    (tmp_path / "objects").mkdir()
    np.savez(tmp_path / "objects" / "o.npz", x=np.zeros(3), y=np.array([{}], dtype=object))
    _refused("o.npz, array 'y', holds Python objects", "objects", tmp_path)

    (tmp_path / "zip").mkdir()
    (tmp_path / "zip" / "z.npz").write_bytes(b"PK\x03\x04" + b"\0" * 20)
    _refused("z.npz does not load as a NumPy array", "zip", tmp_path)


# --- the profile: bounded in bytes before anything is allocated --------------------------------------------------

def _image_model(dtype: str = "float32") -> ModelFacts:
    out = Tensor("maps", "float32", ("batch", 1, "h", "w"), "Sigmoid")
    return ModelFacts(DETECTOR, 11, (Tensor("x", dtype, ("batch", 3, "h", "w")),), (out,))


def test_a_profile_over_the_input_byte_limit_is_refused_before_onnx_runtime_runs(tmp_path, monkeypatch):
    """Photos of 9000x7000 (under MAX_PIXELS): at the profile's max, batch 32, x takes 22.5 GiB. Refused naming
    the input, its max shape, the bytes and the --shape to give, before a session is made or an input drawn (the
    check ran _runs at batch 1 on float64 draws: 1.4 GiB); the --shape it names is under the limit."""
    (tmp_path / "photos").mkdir()
    for i, (h, w) in enumerate([(600, 800), (7000, 9000), (1200, 1600)]):
        _zeros(tmp_path / "photos" / f"p{i}.png", w, h)
    monkeypatch.setattr(profile_module, "_session", lambda model: pytest.fail("ONNX Runtime ran on the profile"))
    data = read_data("photos", tmp_path)
    with pytest.raises(SpecError) as caught:
        propose(_image_model(), data, [])
    line = str(caught.value)
    size = 32 * 3 * 7000 * 9000 * 4
    assert f"input 'x' at the profile's max [32, 3, 7000, 9000] takes {size / 2**30:.3g} GiB (float32)" in line, line
    assert "(MAX_INPUT_BYTES)" in line and "give a smaller max batch, --shape x=1:" in line, line
    flag = line.split("--shape ", 1)[1].split(",", 1)[0]
    n = MAX_INPUT_BYTES // (3 * 7000 * 9000 * 4)
    assert flag == f"x={1}:{min(3, n)}:{n}x3x600:1200:7000x800:1600:9000", flag
    given = propose(_image_model(), data, [parse_shape(flag)])
    assert given.point(2)["x"] == [n, 3, 7000, 9000] and n * 3 * 7000 * 9000 * 4 <= MAX_INPUT_BYTES


def test_a_given_shape_over_the_limit_names_the_profile_to_edit():
    """One sample alone over the limit (no batch to shrink): the --shape proposed to edit, as given."""
    model = ModelFacts(Path("m.onnx"), 17, (Tensor("tokens", "int64", (1, "seq", 65536)),), ())
    with pytest.raises(SpecError, match=r"input 'tokens' at the profile's max \[1, 8192, 65536\] takes 4 GiB "
                                        r"\(int64\).*edit the profile proposed, --shape tokens=1x1:512:8192x65536"):
        propose(model, None, [parse_shape("tokens=1x1:512:8192x65536")])


class _Session:
    def __init__(self) -> None:
        self.fed: list[dict] = []

    def run(self, outputs: list[str] | None, feed: dict[str, np.ndarray]) -> None:
        self.fed.append({n: (v.dtype, v.shape) for n, v in feed.items()})


def test_the_size_check_draws_one_input_at_a_time_in_its_own_dtype():
    """_runs' random input takes the input's bytes (a float64 draw then its float32 copy took three times them),
    and an input numpy cannot allocate is the check's error, not a MemoryError out of init."""
    plan = propose(_image_model(), None, [parse_shape("x=1:1:4x3x512:1024:1024x512:1024:1024")])
    session = _Session()
    tracemalloc.start()
    try:
        assert profile_module._runs(session, plan) is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    one = 3 * 1024 * 1024 * 4
    assert [f["x"] for f in session.fed] == [(np.float32, (1, 3, 512, 512))] + [(np.float32, (1, 3, 1024, 1024))] * 2
    assert peak < 1.5 * one, (peak, one)

    half = propose(_image_model("float16"), None, [parse_shape("x=1x3x64x64")])
    assert profile_module._runs(session, half) is None and session.fed[-1]["x"] == (np.float16, (1, 3, 64, 64))

    huge = propose(_image_model(), None, [parse_shape("x=1x3x64x64")])
    huge = profile_module._with(huge, "x", {2: (2**40, 2**40, 2**40), 3: (2**40, 2**40, 2**40)})
    error = profile_module._runs(session, huge)
    assert error is not None and error.startswith(f"at x [1, 3, {2**40}, {2**40}]: "), error
