"""Names and messages interpolated into Markdown (stage summaries shown as Prefect artifacts, the model card) stay
literal text: rendered by a CommonMark renderer with GFM tables (markdown-it-py), a hostile value makes no HTML
element, no link and no extra table cell (issue #37, item 4)."""
from __future__ import annotations

import importlib
import re
from html.parser import HTMLParser
from urllib.parse import quote

import pytest
from markdown_it import MarkdownIt

from trtflow import markdown
from trtflow.artifact import Provenance
from trtflow.stages.benchmark.report import BenchmarkReport, Gate, Measurement
from trtflow.stages.build.report import BuildEnvironment, BuildReport, CellRow
from trtflow.stages.calibrate.report import CalibrateReport, RangeCheck
from trtflow.stages.compare.records import LayerRow, Layerwise
from trtflow.stages.parity.report import ParityReport
from trtflow.stages.precision.report import PrecisionReport
from trtflow.stages.prepare.report import PrepareReport, Source
from trtflow.stages.release import card
from trtflow.stages.release.report import Option, ReleaseReport, TargetRelease
from trtflow.stages.trt.records import Backend
from trtflow.stages.validate.report import CandidateResult, Reference, Repair, Round, ValidateReport

IMG = "<img src=x onerror=alert(1)>"
VALUES = [IMG, "a|b", "a`b", "``a|b`", "a\nb", f"x\n{IMG}", f"x\n| {IMG} |", "[x](javascript:y)", "**b**",
          "\\|", "a\\", "`", "```", "# h", "<!-- c", "&amp;", "![p](javascript:y)", f"a`{IMG}`|b", "_x_ <b>y</b>"]
# the Markdown of a value, as rendered: literal text, so the same characters (line breaks fold to a space)
MARKUP = {"p", "h1", "h2", "h3", "h4", "table", "thead", "tbody", "tr", "th", "td", "code", "pre", "strong", "em", "ul",
          "ol", "li", "blockquote", "br", "hr"}
_split = importlib.import_module("markdown_it.rules_block.table").escapedSplit


def render(source: str) -> str:
    return MarkdownIt("commonmark").enable("table").render(source)


class Elements(HTMLParser):
    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def literal(value: str) -> str:
    return " ".join(value.split())


def shown(html: str) -> str:
    return literal("".join(Elements(html).text))


def cell_texts(html: str) -> list[str]:
    """The text of each td and th."""
    return [literal(re.sub(r"<[^>]+>", "", c).replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"')
                    .replace("&amp;", "&")) for c in re.findall(r"<t[dh]>(.*?)</t[dh]>", html, re.S)]


def check(source: str, images: list[tuple[str, str]] = ()) -> str:
    """`source` rendered: only Markdown's own elements, no link, no event handler, exactly `images` (alt, src), and
    every table row has its header's number of cells in the source (a renderer pads or drops cells silently)."""
    html = render(source)
    tags = Elements(html).tags
    assert [(a["alt"], a["src"]) for t, a in tags if t == "img"] == list(images), html
    assert {t for t, _ in tags} <= MARKUP | {"img"}, html
    assert not [a for _, attrs in tags for a in attrs if a.lower().startswith("on")], html
    assert "<img src=\"x\"" not in html and "<a " not in html, html
    lines = source.splitlines()
    tokens = MarkdownIt("commonmark").enable("table").parse(source)
    width = None
    for tok in tokens:
        if tok.type == "table_open":
            width = None
        if tok.type == "tr_open":
            cells = _split(lines[tok.map[0]].strip())
            cells = cells[1:] if cells and cells[0] == "" else cells
            cells = cells[:-1] if cells and cells[-1].strip() == "" else cells
            width = width or len(cells)
            assert len(cells) == width, f"{lines[tok.map[0]]!r}: {len(cells)} cells, the header has {width}"
    return html


# ---------------------------------------------------------------------------------------------- the helper

@pytest.mark.parametrize("value", VALUES)
def test_text_is_literal(value):
    html = check(markdown.text(value))
    assert shown(html) == literal(value)
    html = check(f"- **warning**: {markdown.text(value)}")
    assert shown(html) == literal(f"warning: {value}")


@pytest.mark.parametrize("value", VALUES)
def test_code_is_one_literal_span(value):
    html = check(f"stage {markdown.code(value)} ran")
    assert [t for t, _ in Elements(html).tags] == ["p", "code"]
    assert shown(html) == literal(f"stage {value} ran")


@pytest.mark.parametrize("value", VALUES)
def test_a_table_row_keeps_its_cells(value):
    source = "\n".join(["| name | code | row a | row b |", "|---|---|---|---|",
                        f"| {markdown.text(value)} | {markdown.code(value, cell=True)} | "
                        + markdown.row([value, value])[2:]])
    html = check(source)
    assert cell_texts(html)[4:] == [literal(value)] * 4


@pytest.mark.parametrize("value", VALUES)
def test_a_picture_and_a_block(value):
    html = check(markdown.image(value, f"plots/{value}.png"), [(literal(value), quote(f"plots/{value}.png"))])
    assert "javascript:" not in html.split("alt=")[0]
    body = f"stages:\n  x: [{value}]\n```\n{value}\n"
    html = check("\n".join(["before", ""] + markdown.block(body, "yaml") + ["", "after"]))
    assert [t for t, _ in Elements(html).tags] == ["p", "pre", "code", "p"]
    assert Elements(html).text[2].rstrip("\n") == body.rstrip()


# ---------------------------------------------------------------------------------------------- the reports

HOSTILE = [IMG, "a|b", f"a`b{IMG}`|c", f"x\n{IMG}\n| y |"]


def accuracy(h: str) -> dict:
    return {"runtime": h, "samples": 2,
            "outputs": {h: {"max_abs": 1.0, "mean_abs": 0.5, "cosine": 0.9, "nan": 0, "inf": 0, h: 0.25}}}


def release_report(h: str) -> ReleaseReport:
    def option(rank: int, refused: str | None = None) -> Option:
        return Option(name=h, variant=h, precision="int8", target=h, profiles=[h, h], engine_bytes=2_000_000,
                      engine_sha256=h, accuracy={h: {h: 0.5}}, accuracy_drop=0.01, drop_metric=h, p99_ms=1.5,
                      p99_batch=1, samples_per_s=100.0, measured_by=h, higher_precision_nodes=1, nodes=3,
                      refused=refused, rank=rank)
    shipped = TargetRelease(target=h, chosen=option(1), version=3, options=[option(1), option(2), option(0, h)],
                            repository=h, config=f'name: "{h}"\n```\n{h}\n', models=[h, h, h], max_batch_size=8,
                            batch_note=h, environment={"tensorrt": {"flavour": h, "version": h}, "target": h,
                                                       "gpu": [{"name": h, "compute_capability": h, "driver": h}],
                                                       "hardware_compatibility": h, "version_compatible": True})
    none = TargetRelease(target=h, chosen=None, why_none=h, options=[option(0, h)])
    return ReleaseReport(model_name=h, rule={"require": h, "prefer": h, "max_accuracy_drop": 0.01, "variants": [h],
                                             "profiles": [h]},
                         targets=[shipped, none], lineage=[Provenance(h, h, h, {h: h}), Provenance(h, h, "", {})],
                         preprocessing=[{"op": h, h: [h]}], parity={"verdict": h, "images": 2, "top1": 0.5},
                         numbers_note=h, warnings=[h, h])


@pytest.mark.parametrize("h", HOSTILE)
def test_the_release_summary(h):
    report = release_report(h)
    html = check(report.summary())
    assert cell_texts(html).count(literal(h)) >= 4  # the engine's name and the refusal, whole in their cells
    assert "<strong>shipped</strong>" in html


@pytest.mark.parametrize("h", HOSTILE)
def test_the_model_card(h):
    report = release_report(h)
    plot = f"plots/00-{h}.png"
    check(card.markdown(report, {f"validate: {h}": plot}), [(literal(f"validate: {h}"), quote(plot))])
    page = card.to_html(report, {})  # the HTML card is html.escape's, and stays so
    assert IMG not in page and "<strong>shipped</strong>" not in page and "**" not in page


def layer(h: str) -> LayerRow:
    return LayerRow(node=h, op=h, tensor=h, cosine=0.5, rms_rel=0.1, nonfinite=0, reference_nonfinite=0,
                    reference_max=7e4, drift=0.5, added=0.1, over_fp16=1, range=[-1.0, 1.0], clipped=0.1,
                    range_use=0.5)


@pytest.mark.parametrize("h", HOSTILE)
def test_the_validate_summary(h):
    row = layer(h)
    cand = CandidateResult(name=h, variant=h, precision="int8", runtime=h, engine=h, data=h, shapes=[{h: [1, 3]}],
                           bounds={h: {h: 0.5}}, accuracy=accuracy(h), passed=False, violations=[h],
                           not_on_tensorrt=h, warnings=[h], plots=[f"plots/{h}.errors.png"],
                           layerwise=Layerwise(samples=2, tensors=3, bound=0.99, first_bad=row, worst=[row, row],
                                               overflow=[row], clipping=[row], on=h))
    repair = Repair(variant=h, precision="fp16", passed=False, nodes=[h, h], of=3,
                    rounds=[Round(give_back=[h, h, h, h], nodes=[h], violations=[h]),
                            Round(without=[h], nodes=[h], violations=[])],
                    yaml=f"stages:\n  {h}:\n    block_nodes: ['{h}']\n```\n")
    for rep in (repair, Repair(variant=h, precision=h, passed=False, note=h)):
        report = ValidateReport(reference=Reference(model=h, runtime=h), data=h, candidates=[cand], repair=rep,
                                passed=False, shipped=[], not_shipped={h: h}, warnings=[h])
        html = check(report.summary(), [(literal(f"plots/{h}.errors.png"), quote(f"plots/{h}.errors.png"))])
        assert literal(h) in cell_texts(html)


@pytest.mark.parametrize("h", HOSTILE)
def test_the_build_summary(h):
    def cell(**kw) -> CellRow:
        return CellRow(name=h, variant=h, precision="int8", target=h, profiles=[h, h], shapes={h: {h: [1]}},
                       validity={"checked": True, "validity": h, "diagnostics": [h]}, **kw)
    backend = Backend(flavour=h, module=h, version=h)
    report = BuildReport(backend=backend, environment=BuildEnvironment(tensorrt=backend),
                         cells=[cell(status="failed", error=h), cell(status="ok", reused=h, engine_bytes=10)],
                         wall_seconds=1.0, parallel=1, timing_cache=h, warnings=[h])
    html = check(report.summary())
    assert literal(h) in cell_texts(html)


@pytest.mark.parametrize("h", HOSTILE)
def test_the_benchmark_summary(h):
    def measured(ok: bool) -> Measurement:
        result = {"has_summary": ok, "note": h, "runtime": h, "throughput_qps": 10.0,
                  "latency_ms": {"mean": 1.0, "p99": 2.0}}
        return Measurement(cell=h, candidate=h, variant=h, precision="int8", profile=h, point="opt", shapes={h: [1]},
                           environment={h: h}, result=result, iterations=3, samples_per_s=10.0,
                           slowest_layers=[{"name": h, "average_ms": 0.5, "percent": 12.0}])
    for telemetry in ({"available": False, "why": h}, {"available": True, "samples": 3, "throttled": [h]}):
        report = BenchmarkReport(tool=h, trtexec=None, trtexec_looked=[h], tensorrt_version=h,
                                 cells=[measured(True), measured(False)], telemetry=telemetry,
                                 gate=Gate(baseline=h, violations=[h], skipped=[h]), warnings=[h],
                                 not_measured={h: h}, plots=[f"plots/{h}.png"])
        html = check(report.summary(), [("latency", quote(f"plots/{h}.png"))])
        assert literal(h) in cell_texts(html)


@pytest.mark.parametrize("h", HOSTILE)
def test_the_precision_summary(h):
    report = PrecisionReport(to=h, nodes=3, fp16_nodes=2, kept_fp32={h: h, "b": h}, island=h, data=h,
                             calibration_samples=1, holdout_samples=1, fallback={h: h}, accuracy=accuracy(h),
                             trial_build={"ran": True, "runtime": h, "shapes": {h: [1]}, "ok": False, "error": h},
                             warnings=[h])
    html = check(report.summary())
    assert literal(h) in cell_texts(html)


@pytest.mark.parametrize("h", HOSTILE)
def test_the_prepare_summary(h):
    io = [{"name": h, "dtype": h, "shape": [1, h]}, {"name": "y", "dtype": "float32", "shape": [1]}]
    inventory = {"opsets": {"ai.onnx": 17}, "nodes": 3, "initializers": 1, "initializer_bytes": 10, "inputs": io,
                 "outputs": io, "ops": {"": {h: 3, "Conv": 2}}}
    check_ok = {"ok": True, "samples": 2, "data": h, "outputs": {h: {"max_abs": 0.0}}, "rtol": 1e-3, "atol": 1e-4,
                "runtime": h}
    preflights = [{"ran": False, "reason": h},
                  {"ran": True, "parsed": False, "runtime": h, "failures": [{"node": h, "op_type": h, "reason": h,
                                                                             "hint": h}],
                   "trial_build": {"shapes": {h: [1]}, "ok": False, "error": h, "hint": h}}]
    for preflight, simplified in zip(preflights, (False, True)):
        report = PrepareReport(source=Source(path=h, digest=h, external_data=False), before=inventory,
                               after=inventory, full_check=h,
                               sanitized_dims=[{"tensor": h, "axis": 0, "was": h, "now": h}],
                               conversion={"from": 11, "to": 17, "check": {"ok": None, "skipped": h}},
                               simplification={"requested": True, "applied": simplified, "tool": h, "reason": h,
                                               "check": check_ok},
                               dynamic_dims=[{"input": h, "axis": 0, "name": h}], constants_to_initializers=2,
                               preflight=preflight, timings={}, warnings=[h])
        html = check(report.summary(h))
        if simplified:
            assert literal(h) in cell_texts(html)


@pytest.mark.parametrize("h", HOSTILE)
def test_the_calibrate_summary(h):
    report = CalibrateReport(method=h, percentile=None, data=h, calibration_samples=4, holdout_samples=2,
                             full_range_tensors=[h], range_check=RangeCheck(samples=2, errors={h: 0.1}, used=h,
                                                                            rule=h),
                             excluded_nodes=[h], quantize_ops=[h], left_in_float={h: h, "n2": h},
                             quantize_linear_nodes=1, accuracy=accuracy(h), warnings=[h])
    html = check(report.summary())
    assert literal(h) in cell_texts(html)


@pytest.mark.parametrize("h", HOSTILE)
def test_the_parity_summary(h, tmp_path):
    good = {"image": h, "shape_ok": True, "max_abs": 0.01, "mean_abs": 0.001, "psnr": 50.0}
    bad = {"image": h, "shape_ok": False, "deploy_shape": [1, 3], "training_shape": [1, 4], "max_abs": 1.0,
           "mean_abs": 1.0, "psnr": 0.0}
    pred = {"image": h, "training": 0, "training_score": 0.9, "deploy": 1, "deploy_score": 0.5}
    model = {"ran": True, "runtime": h, "max_abs_diff": 0.5, "top1": 0.5, "top5": 1.0, "predictions": [pred]}
    search = {"evaluations": 3, "images": 1, "seconds": 0.1, "rounds": 1, "max_rounds": 2, "beam": 2}
    found = {"cause": h, "fix": h, "search": search, "chain": [{"cause": h, "fix": h, "mean_abs": 0.1,
                                                                 "max_abs": 0.2}],
             "declared": {"mean_abs": 1.0, "max_abs": 2.0}, "yaml": f"deploy:\n```\n{h}\n",
             "after_fix": {"images": 2, "passing": 2, "model": {"ran": True, "top1": 1.0, "predictions": [pred]}}}
    none = {"search": search, "tried": [{"fix": h, "mean_abs": 0.5, "ok": False}]}
    picture = tmp_path / (h.replace("\n", " ") + ".png")
    picture.write_bytes(b"\x89PNG")
    for diagnosis in (found, none):
        report = ParityReport(verdict="fail", preprocess_digest=h, steps=[{"read": h}],
                              runtimes={"deploy": h, "training": h}, tolerances={"max_abs": 0.1, "mean_abs": 0.1},
                              images=[good, bad], model=model, diagnosis=diagnosis, worst_image=h)
        html = check(report.summary(picture), [("worst", "data:image/png;base64,iVBORw==")])
        assert literal(h) in cell_texts(html)


def test_plain_names_read_as_before():
    """Escaped, a plain name renders as it did: names in code spans, numbers as formatted, the verdict in bold."""
    html = render(release_report("resnet50.fp16").summary())
    assert "<code>resnet50.fp16</code>" in html and "<strong>shipped</strong>" in html
    assert "<td>1.5 (batch 1)</td>" in html and "<td>1.00% on resnet50.fp16</td>" in html
