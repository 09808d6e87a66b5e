"""The model card of a release, as Markdown and as one self-contained HTML page (styles inline, pictures as data
URIs: it opens from anywhere, mailed or attached to a ticket). Both are written from the release report, so they
say the same; every number in the HTML carries its unrounded value (`data-value`) for whoever checks it."""
from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any, Callable

from trtflow import markdown as md
from trtflow.stages.compare.records import Labelled
from trtflow.stages.prepare.report import OffloadRecord
from trtflow.stages.release.report import HEADER, Option, ReleaseReport, TargetRelease, ValidFor, rule_text
from trtflow.stages.release.triton.contract import Contract
from trtflow.stages.validate.report import SHAPE_HEADER, shape_table

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#1b1f24;padding:0 1em}
h1{font-size:1.6em;margin-bottom:.2em} h2{border-bottom:1px solid #d0d7de;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.6em 0} th,td{border:1px solid #d0d7de;padding:4px 8px;text-align:left}
th{background:#f6f8fa} tr.shipped td{background:#dafbe1} tr.refused td{color:#6e7781}
code,pre{font-family:ui-monospace,monospace;font-size:12.5px} pre{background:#f6f8fa;padding:.8em;overflow:auto}
.warn{background:#fff8c5;border:1px solid #d4a72c;padding:.5em .8em;margin:.4em 0}
img{max-width:100%;border:1px solid #d0d7de;margin:.4em 0} .muted{color:#57606a}
"""


def write(report: ReleaseReport, plots: dict[str, Path], out_dir: Path) -> tuple[Path, Path]:
    """model-card.md (its pictures copied beside it, under plots/) and model-card.html; `plots`: caption ->
    PNG file."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "plots").mkdir(exist_ok=True)
    shown: dict[str, str] = {}
    for n, (caption, src) in enumerate(plots.items()):
        name = f"plots/{n:02d}-{src.name}"
        (out_dir / name).write_bytes(src.read_bytes())
        shown[caption] = name
    md = out_dir / "model-card.md"
    md.write_text(markdown(report, shown))
    page = out_dir / "model-card.html"
    page.write_text(to_html(report, {c: out_dir / p for c, p in shown.items()}))
    for t in report.targets:
        if t.request_example:
            (out_dir / request_file(t.target)).write_text(t.request_example)
    return md, page


OFFLOAD_NOTE = ("TensorRT refuses part of this model, so prepare cut it into pieces (offload: onnxruntime): the "
                "TensorRT pieces are engines, the others run on ONNX Runtime in FP32, and the Triton ensemble under "
                "the model's name runs them in order, handing each piece's outputs to the next. Validate and "
                "benchmark measured the chain, boundaries included.")
REWRITES_NOTE = ("Nodes TensorRT's parser refused, replaced by prepare with nodes it takes; each replacement was "
                 "checked on ONNX Runtime (largest difference over the outputs, FP32) and by the parser before it "
                 "was kept. Every engine here was built from the model so changed.")


def request_file(target: str) -> str:
    """The card's request example for `target`, beside the card (a target is a checked name: names.py)."""
    return f"request-{target}.py"


# ---------------------------------------------------------------------------------------------- Markdown

def markdown(report: ReleaseReport, plots: dict[str, str]) -> str:
    lines = [f"# Model card: {md.code(report.model_name)}", "",
             f"Released by trtflow's release stage. Rule: {rule_text(report.rule, md.text)}.", ""]
    for t in report.targets:
        lines += _target_md(t, report.labelled)
    if report.numbers_note:
        lines += [f"> {md.text(report.numbers_note)}", ""]
    lines += ["## Preprocessing", ""] + _preprocessing_md(report) + [""]
    if report.rewrites:
        lines += ["## What was changed in the model", "", REWRITES_NOTE, "",
                  "| node | op | rule | replaced by | max abs diff | |", "|---|---|---|---|---|---|"]
        lines += [r.row() for r in report.rewrites] + [""]
    if report.offload:
        lines += ["## Where each node runs", "", OFFLOAD_NOTE, ""] + report.offload.lines()[1:] + [""]
    lines += ["## Provenance", "", "Every result this release was made from, down to the source model:", "",
              "| stage | kind | key | outputs (sha256) |", "|---|---|---|---|"]
    lines += [f"| {md.text(p.stage)} | {md.text(p.kind)} | {md.code(p.key or '-', cell=True)} | "
              + ", ".join(f"{md.text(o)} {md.code(d, cell=True)}" for o, d in p.outputs.items()) + " |"
              for p in report.lineage]
    if plots:
        lines += ["", "## Pictures", ""] + [f"**{md.text(c)}**\n\n{md.image(c, p)}\n" for c, p in plots.items()]
    if report.warnings:
        lines += ["", "## Warnings", ""] + [f"- {md.text(w)}" for w in report.warnings]
    return "\n".join(lines) + "\n"


def labelled_line(chosen: Option, fp32: Labelled | None) -> str | None:
    """'Against the labels (8 labelled samples): FP32 top1 100.00%; shipped (int8.lines.native) top1 87.50%', or
    None."""
    got = chosen.labelled
    if got is None or fp32 is None:
        return None
    return (f"Against the labels ({got.samples} labelled samples): FP32 {_values(fp32)}; shipped ({chosen.name}) "
            f"{_values(got)}")


def _values(labelled: Labelled) -> str:
    return ", ".join(f"{m} {v:.2%}" for m, v in labelled.values.items())


def _target_md(t: TargetRelease, fp32: Labelled | None = None) -> list[str]:
    lines = [f"## Target {md.code(t.target)}", ""]
    if t.held is not None:
        lines += [f"**Previous version {t.version} kept** (no new version): {md.text(t.held)}", ""]
    elif t.chosen is None:
        lines += [f"**Nothing shipped**: {md.text(t.why_none)}", ""]
    else:
        lines += _chosen_md(t, t.chosen, fp32)
    lines += ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += [o.md_row() for o in t.options]
    if t.stability:
        lines += ["", f"Selection: {md.text(t.stability)}."]
    if t.precision_order:
        lines += ["", f"Order across precisions: {md.text(t.precision_order)}."]
    if t.contract is not None:
        lines += ["", "### Serving contract", ""] + _contract_md(t)
    return lines + _serving_md(t) + [""]


def _chosen_md(t: TargetRelease, c: Option, fp32: Labelled | None) -> list[str]:
    """What shipped for the target: the engine, the version, a rollback, the labelled accuracy, the environment,
    the models and the shapes it was checked at."""
    profiles = ", ".join(md.text(n) for n in c.profiles)
    lines = [f"**Shipped**: {md.code(c.name)} ({md.text(c.precision)}, variant {md.code(c.variant)}, profile(s) "
             f"{profiles}) as Triton version **{t.version}** in {md.code(t.repository)}; max_batch_size "
             f"{t.max_batch_size}" + (f" ({md.text(t.batch_note)})" if t.batch_note else "") + ".", ""]
    if t.rolls_back_to is not None:
        lines += [f"**Rollback**: version {t.version} ships again the engine of version {t.rolls_back_to}; version "
                  f"{t.previous_version} was the latest before it.", ""]
    said = labelled_line(c, fp32)
    if said is not None:
        lines += [f"**{md.text(said)}**", ""]
    lines += ["Valid for: " + _environment_text(t.environment, md.text), ""]
    if len(t.models) > 1:
        lines += [f"Models in the repository: {', '.join(md.code(m) for m in t.models)}: send encoded images to "
                  f"{md.code(t.models[-1])} (the declared preprocessing runs in {md.code(t.models[1])}, trtflow's "
                  "own code).", ""]
    if c.shapes:
        lines += [md.text(SHAPES_NOTE), ""] + shape_table(c.shapes) + [""]
    return lines


def _serving_md(t: TargetRelease) -> list[str]:
    """The target's Triton configs, the preprocessing model's packages and the request example."""
    lines: list[str] = _plugins_md(t)
    if t.config:
        lines += ["", "`config.pbtxt`:", ""] + md.block(t.config, "protobuf")
    for name, text in t.configs.items():
        lines += ["", f"{md.code(name)} `config.pbtxt`:", ""] + md.block(text, "protobuf")
    if t.requirements:
        lines += ["", "The preprocessing model runs in Triton's Python backend and needs these packages (its "
                  "`requirements.txt`), exactly:", ""] + md.block("\n".join(t.requirements), "text") + [
            "", SERVE_ENV]
    if t.request_example:
        lines += ["", "### Request example", "", f"{md.code(request_file(t.target))} beside this card: Python with "
                  "`tritonclient[http]`; `TRITON_URL` is the server (default `localhost:8000`)"
                  + ("; give an image file to send it through the ensemble" if len(t.models) > 1 else "") + ":", ""]
        lines += md.block(t.request_example, "python")
    return lines


def plugin_text(t: TargetRelease) -> list[str]:
    """What the card says of the TensorRT plugins the engine was built with (none: nothing), one sentence each:
    the libraries shipped and how Triton loads them, a Python plugin stock Triton cannot load."""
    out = []
    for p in t.plugins:
        if p.file is not None:
            out.append(f"{p.key} ({p.label}): {p.file}, sha256 {p.sha256}. Triton only loads it (dlopen): its "
                       f"creators must register themselves as it loads (REGISTER_TENSORRT_PLUGIN)"
                       + (f"; {p.entry}('{p.namespace}') is not called" if p.entry else "") + ".")
        else:
            out.append(f"{p.key} ({p.label}): a Python plugin. Triton's TensorRT backend loads plugin libraries "
                       f"only: the engine is not servable by stock Triton with it; the serving process must import "
                       f"{p.python} (registering its creators) before it deserializes the engine.")
    return out


SERVE_PLUGINS = ("Start Triton with the libraries loaded by its TensorRT backend, `--backend-config=tensorrt,plugins="
                 "\"<path>;<path>\"` (`LD_PRELOAD` of them works too), from the release's output folder:")


def _plugins_md(t: TargetRelease) -> list[str]:
    said = plugin_text(t)
    if not said:
        return []
    lines = ["", "### TensorRT plugins", "", "The engine needs these plugins wherever it is deserialized:", ""]
    lines += [f"- {md.text(line)}" for line in said]
    return lines + (["", SERVE_PLUGINS, ""] + md.block(t.server, "sh") if t.server else [])


def _plugins_html(t: TargetRelease) -> list[str]:
    said = plugin_text(t)
    if not said:
        return []
    server = f'<p>{_e(SERVE_PLUGINS)}</p><pre data-field="server">{_e(t.server)}</pre>' if t.server else ""
    return ['<h3>TensorRT plugins</h3><p>The engine needs these plugins wherever it is deserialized:</p>'
            '<ul data-field="plugins">' + "".join(f"<li>{_e(line)}</li>" for line in said) + "</ul>" + server]


# how to give Triton's Python backend the packages (Triton's python_backend README: "Using Custom Python Execution
# Environments")
SERVE_ENV = ("Provide them either in the server's own Python environment (`pip install -r requirements.txt` in the "
             "Triton container), or as an environment of the model's own: pack a conda environment with "
             "`conda-pack` and name it in the preprocessing model's config, `parameters: {key: "
             "\"EXECUTION_ENV_PATH\", value: {string_value: \"$$TRITON_MODEL_DIRECTORY/env.tar.gz\"}}`. numpy must "
             "stay below 2 on Triton 2.51 and 2.52, whose Python backend corrupts numpy 2 tensors silently.")


def _contract_rows(c: Contract) -> list[tuple[str, str, str, str, str, str, str, str]]:
    """The contract's table, one row per input and profile, one per output: tensor, kind, data type, dims (as
    Triton declares them), profile, min, opt, max (unescaped: the Markdown and the HTML card escape them)."""
    rows = []
    for tensor in c.inputs:
        ranges = [(p.name, p.shapes[tensor.name]) for p in c.profiles if tensor.name in p.shapes] or [("-", None)]
        for name, rng in ranges:
            lo, opt, hi = (list(map(str, rng)) if rng else ["-"] * 3)
            rows.append((tensor.name, "input", tensor.data_type, str(tensor.dims), name, lo, opt, hi))
    rows += [(t.name, "output", t.data_type, str(t.dims), "", "", "", "") for t in c.outputs]
    return rows


SHAPES_NOTE = ("Validated at each shape of its profiles against the FP32 reference (the last column says how each "
               "row's data was made from the declared data):")


CONTRACT_HEADER = ["tensor", "kind", "data type", "dims (Triton)", "profile", "min", "opt", "max"]
CONTRACT_NOTE = ("The shapes each optimization profile takes (Triton passes any size where its config says -1; the "
                 "engine takes only these):")


def _contract_md(t: TargetRelease) -> list[str]:
    c = t.contract
    assert c is not None
    lines = [f"max_batch_size {c.max_batch_size}, dynamic batching {'on' if c.dynamic_batching else 'off'}. "
             + CONTRACT_NOTE, "", "| " + " | ".join(CONTRACT_HEADER) + " |", "|" + "---|" * len(CONTRACT_HEADER)]
    for name, *rest in _contract_rows(c):
        lines.append("| " + " | ".join([md.code(name, cell=True), *(md.text(x) if x else "" for x in rest)]) + " |")
    if t.contract_changes:
        lines += ["", "Changed since the previous version (a client written for it may be refused):", ""]
        lines += [f"- {md.text(change)}" for change in t.contract_changes]
    return lines


def _environment_text(env: ValidFor, name: Callable[[Any], str] = str) -> str:
    """What the engine is valid for, in words; `name`: how a value is written (`markdown.text` in Markdown)."""
    trt = env.tensorrt
    flavour, version = (trt.flavour, trt.version) if trt else ("?", "?")
    parts = [f"{name(flavour)} {name(version)}", f"target {name(env.target)}"]
    target = env.target or ""
    if target.startswith("sm") and target[2:].isdigit():
        parts.append(f"GPUs of compute capability {name(target[2:-1] + '.' + target[-1])}")
    parts.append("built on " + (", ".join(f"{name(g.name)} (compute capability {name(g.compute_capability)}, "
                                          f"driver {name(g.driver)})" for g in env.gpu)
                                if env.gpu else "a machine without a GPU"))
    if trt and trt.version:
        parts.append(f"serve it with a Triton whose TensorRT backend links {name(trt.flavour)} "
                     f"{name(trt.version)} (a Triton release's notes name its TensorRT; an engine loads only on "
                     f"the TensorRT version that built it)")
    if env.hardware_compatibility:
        parts.append(f"hardware compatibility: {name(env.hardware_compatibility)}")
    if env.version_compatible:
        parts.append(f"version compatible: {name(env.version_compatible)}")
    return "; ".join(parts)


def _preprocessing_md(report: ReleaseReport) -> list[str]:
    if not report.preprocessing:
        return ["No preprocessing declared (no parity stage): the engine takes tensors as they are."]
    steps = "\n".join(f"- {json.dumps(step)}" for step in report.preprocessing)
    lines = ["As declared (the deploy steps the parity stage checked, in order):", ""] + md.block(steps, "yaml") + [""]
    p = report.parity
    if p:
        lines.append(f"Parity against the training transforms: **{md.text(p.verdict)}** on {p.images} image(s)"
                     + (f", model top-1 agreement {p.top1:.0%}" if p.top1 is not None else "") + ".")
    return lines


# ---------------------------------------------------------------------------------------------- HTML

def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(value: float | int | None, text: str, field: str) -> str:
    raw = "" if value is None else f' data-value="{_e(repr(value))}"'
    return f'<td data-field="{field}"{raw}>{_e(text)}</td>'


def _row(o: Option) -> str:
    cells = o.cells()
    css = "shipped" if o.rank == 1 else ("refused" if o.refused else "")
    acc = "<br>".join(f'{_e(out)}/{_e(m)} <span data-field="metric" data-metric="{_e(out)}/{_e(m)}" '
                      f'data-value="{_e(repr(v))}">{v:.4g}</span>'
                      for out, metrics in o.accuracy.items() for m, v in metrics.items()) or "-"
    return (f'<tr class="{css}" data-engine="{_e(o.name)}"><td><code>{_e(o.name)}</code></td><td>{_e(o.precision)}'
            f'</td><td>{acc}</td>' + _num(o.accuracy_drop, cells[3], "accuracy_drop")
            + _num(o.p99_ms, cells[4], "p99_ms") + _num(o.samples_per_s, cells[5], "samples_per_s")
            + _num(o.engine_bytes, cells[6], "engine_bytes")
            + _num(o.higher_precision_nodes, cells[7], "higher_precision_nodes")
            + _num(o.composition.mac_share.fp32 if o.composition else None, cells[8], "fp32_mac_share")
            + f'<td data-field="verdict">{_e(cells[9].replace("**", ""))}</td></tr>')


def _image(path: Path, caption: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<figure><img alt="{_e(caption)}" src="data:image/png;base64,{data}"><figcaption>{_e(caption)}' \
           f'</figcaption></figure>'


def _contract_html(t: TargetRelease) -> str:
    c = t.contract
    assert c is not None
    rows = [f'<tr data-tensor="{_e(name)}"><td><code>{_e(name)}</code></td><td>{_e(kind)}</td><td>{_e(dtype)}</td>'
            f'<td>{_e(dims)}</td><td>{_e(profile)}</td><td data-field="min">{_e(lo)}</td><td>{_e(opt)}</td>'
            f'<td data-field="max">{_e(hi)}</td></tr>'
            for name, kind, dtype, dims, profile, lo, opt, hi in _contract_rows(c)]
    changes = ("<p>Changed since the previous version (a client written for it may be refused):</p><ul>"
               + "".join(f"<li>{_e(x)}</li>" for x in t.contract_changes) + "</ul>") if t.contract_changes else ""
    return (f"<h3>Serving contract</h3><p>max_batch_size {c.max_batch_size}, dynamic batching "
            f"{'on' if c.dynamic_batching else 'off'}. {_e(CONTRACT_NOTE)}</p><table><thead><tr>"
            + "".join(f"<th>{_e(h)}</th>" for h in CONTRACT_HEADER) + "</tr></thead><tbody>" + "".join(rows)
            + "</tbody></table>" + changes)


def _target_html(t: TargetRelease, fp32: Labelled | None) -> list[str]:
    body = [f'<h2 data-target="{_e(t.target)}">Target <code>{_e(t.target)}</code></h2>']
    if t.held is not None:
        body.append(f'<p><strong>Previous version <span data-field="version">{t.version}</span> kept</strong> '
                    f'(no new version): <span data-field="held">{_e(t.held)}</span></p>')
    elif t.chosen is None:
        body.append(f"<p><strong>Nothing shipped</strong>: {_e(t.why_none)}</p>")
    else:
        body += _chosen_html(t, t.chosen, fp32)
    body.append("<table><thead><tr>" + "".join(f"<th>{_e(h)}</th>" for h in HEADER) + "</tr></thead><tbody>"
                + "".join(_row(o) for o in t.options) + "</tbody></table>")
    if t.stability:
        body.append(f'<p data-field="stability">Selection: {_e(t.stability)}.</p>')
    if t.precision_order:
        body.append(f'<p data-field="precision_order">Order across precisions: {_e(t.precision_order)}.</p>')
    if t.contract is not None:
        body.append(_contract_html(t))
    return body + _serving_html(t)


def _chosen_html(t: TargetRelease, c: Option, fp32: Labelled | None) -> list[str]:
    body = [f'<p><strong>Shipped</strong>: <code data-field="chosen">{_e(c.name)}</code> '
            f'({_e(c.precision)}, variant <code>{_e(c.variant)}</code>, profile(s) '
            f'{_e(", ".join(c.profiles))}) as Triton version <strong data-field="version">'
            f'{t.version}</strong> in <code>{_e(t.repository)}</code>; max_batch_size '
            f'<span data-field="max_batch_size">{t.max_batch_size}</span>'
            + (f" ({_e(t.batch_note)})" if t.batch_note else "") + ".</p>"]
    if t.rolls_back_to is not None:
        body.append(f'<p data-field="rollback"><strong>Rollback</strong>: version {t.version} ships again '
                    f'the engine of version {t.rolls_back_to}; version {t.previous_version} was the latest '
                    f'before it.</p>')
    said = labelled_line(c, fp32)
    if said is not None:
        body.append(f'<p data-field="labelled"><strong>{_e(said)}</strong></p>')
    body.append(f"<p>Valid for: {_e(_environment_text(t.environment))}</p>")
    if len(t.models) > 1:
        body.append(f"<p>Models in the repository: {_e(', '.join(t.models))}: send encoded images to "
                    f"<code>{_e(t.models[-1])}</code> (the declared preprocessing runs in "
                    f"<code>{_e(t.models[1])}</code>, trtflow's own code).</p>")
    if c.shapes:
        body.append(f"<p>{_e(SHAPES_NOTE)}</p><table><thead><tr>"
                    + "".join(f"<th>{_e(h)}</th>" for h in SHAPE_HEADER) + "</tr></thead><tbody>"
                    + "".join(f'<tr data-shape="{_e(row.name)}" data-passed="{str(row.passed).lower()}">'
                              + "".join(f"<td>{_e(x)}</td>" for x in row.cells()) + "</tr>"
                              for row in c.shapes) + "</tbody></table>")
    return body


def _serving_html(t: TargetRelease) -> list[str]:
    body = _plugins_html(t)
    if t.config:
        body.append(f"<details open><summary><code>config.pbtxt</code></summary><pre>{_e(t.config)}</pre>"
                    f"</details>")
    for name, text in t.configs.items():
        body.append(f"<details><summary><code>{_e(name)}</code> config.pbtxt</summary><pre>{_e(text)}</pre>"
                    f"</details>")
    if t.requirements:
        body.append("<p>The preprocessing model runs in Triton's Python backend and needs these packages (its "
                    f"<code>requirements.txt</code>), exactly:</p><pre data-field=\"requirements\">"
                    f"{_e(chr(10).join(t.requirements))}</pre><p>{_e(SERVE_ENV)}</p>")
    if t.request_example:
        body.append("<h3>Request example</h3><p>Python with <code>tritonclient[http]</code>; "
                    "<code>TRITON_URL</code> is the server (default <code>localhost:8000</code>).</p>"
                    f'<pre data-field="request-example">{_e(t.request_example)}</pre>')
    return body


def _preprocessing_html(report: ReleaseReport) -> str:
    if not report.preprocessing:
        return "<h2>Preprocessing</h2><p>No preprocessing declared (no parity stage): the engine takes tensors as " \
               "they are.</p>"
    html = ("<h2>Preprocessing</h2><p>As declared (the deploy steps the parity stage checked, in order):</p><ol>"
            + "".join(f"<li><code>{_e(json.dumps(s))}</code></li>" for s in report.preprocessing) + "</ol>")
    p = report.parity
    if p:
        html += (f'<p>Parity against the training transforms: <strong data-field="parity">{_e(p.verdict)}'
                 f'</strong> on {p.images} image(s)'
                 + (f", model top-1 agreement {p.top1:.0%}" if p.top1 is not None else "") + ".</p>")
    return html


def _offload_html(offload: OffloadRecord) -> str:
    def specs(tensors: list) -> str:
        return "<br>".join(f"<code>{_e(t.name)}</code> {_e(t.dtype)} {_e(t.dims())}" for t in tensors)
    pieces = "".join(f'<tr data-piece="{i}"><td>{i}</td><td data-field="runtime">{_e(p.runtime)}</td>'
                     f"<td>{len(p.nodes)}</td><td>{specs(p.inputs)}</td><td>{specs(p.outputs)}</td></tr>"
                     for i, p in enumerate(offload.pieces))
    nodes = "".join(f'<tr data-offloaded="{_e(n.name)}"><td><code>{_e(n.name)}</code></td><td>{_e(n.op_type)}</td>'
                    f"<td>{_e(n.why)}</td></tr>" for n in offload.nodes)
    return ("<h2>Where each node runs</h2>" f"<p>{_e(OFFLOAD_NOTE)}</p>"
            "<table><thead><tr><th>piece</th><th>runtime</th><th>nodes</th><th>reads</th><th>hands on</th></tr>"
            f"</thead><tbody>{pieces}</tbody></table>"
            "<table><thead><tr><th>node on ONNX Runtime</th><th>op</th><th>why</th></tr></thead>"
            f"<tbody>{nodes}</tbody></table>")


def to_html(report: ReleaseReport, plots: dict[str, Path]) -> str:
    body = [f"<h1>Model card: <code>{_e(report.model_name)}</code></h1>",
            f'<p class="muted">Released by trtflow\'s release stage. Rule: {_e(rule_text(report.rule))}.</p>']
    for w in report.warnings:
        body.append(f'<div class="warn">{_e(w)}</div>')
    for t in report.targets:
        body += _target_html(t, report.labelled)
    if report.numbers_note:
        body.append(f'<p class="muted">{_e(report.numbers_note)}</p>')
    body.append(_preprocessing_html(report))
    if report.rewrites:
        body.append("<h2>What was changed in the model</h2>" f"<p>{_e(REWRITES_NOTE)}</p>"
                    "<table><thead><tr><th>node</th><th>op</th><th>rule</th><th>replaced by</th><th>max abs diff</th>"
                    "</tr></thead><tbody>" + "".join(
                        f'<tr data-rewrite="{_e(r.node)}"><td><code>{_e(r.node)}</code></td><td>{_e(r.op_type)}</td>'
                        f"<td><code>{_e(r.rule)}</code></td><td>{_e(r.summary)}</td>"
                        f'<td data-field="max-abs">{(r.max_abs or 0.0):.3g}</td></tr>' for r in report.rewrites)
                    + "</tbody></table>")
    if report.offload:
        body.append(_offload_html(report.offload))
    body.append("<h2>Provenance</h2><p>Every result this release was made from, down to the source model:</p>"
                "<table><thead><tr><th>stage</th><th>kind</th><th>key</th><th>outputs (sha256)</th></tr></thead>"
                "<tbody>" + "".join(
                    f'<tr data-stage="{_e(p.stage)}"><td>{_e(p.stage)}</td><td>{_e(p.kind)}</td>'
                    f'<td><code data-field="key">{_e(p.key or "-")}</code></td><td>'
                    + "<br>".join(f"{_e(o)} <code>{_e(d)}</code>" for o, d in p.outputs.items()) + "</td></tr>"
                    for p in report.lineage) + "</tbody></table>")
    if plots:
        body.append("<h2>Pictures</h2>" + "".join(_image(p, c) for c, p in plots.items()))
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>Model card: {_e(report.model_name)}</title><style>{CSS}</style></head><body>"
            + "\n".join(body) + "</body></html>\n")
