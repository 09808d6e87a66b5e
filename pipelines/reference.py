"""The reference of every pipeline option, generated from the parameter models (`trtflow reference` writes it to
docs/reference.md; tests/test_reference.py fails when the committed file is not what it writes now).

A row per option: its key path (nested models flattened as `a.b.c`, a list's items as `a[].b`, a mapping's keys
as `<placeholder>`), its type (with its unit), default, description and the examples its Field declares.
"""
from __future__ import annotations

import dataclasses
import json
import re
import sys
import types
from dataclasses import dataclass
from typing import Annotated, Any, Iterator, Literal, Union, get_args, get_origin, get_type_hints

import yaml
from pydantic import BaseModel, BeforeValidator
from pydantic.fields import FieldInfo

from trtflow import markdown
from trtflow.pipelines import units
from trtflow.pipelines.kinds import KINDS, USER
from trtflow.pipelines.pipeline import Pipeline
from trtflow.pipelines.row import ANY_KIND, Kind, Slot
from trtflow.pipelines.schema import StageBase

COMMAND = "trtflow reference --force -o docs/reference.md"
LIST = "[]"  # the path segment of a list's items

# What a mapping's keys (and a model's own extra keys) are, by the option's name, outermost first: its rows show
# them as `<placeholder>`
KEYS = {
    "stages": ("stage",), "inputs": ("slot",), "metrics": ("output",), "tolerances": ("output", "metric"),
    "profiles": ("profile", "input"), "shapes": ("input",), "ranges": ("input",), "pad": ("input",),
    "input_shapes": ("input",), "outputs": ("output",), "params": ("name",), "parameters": ("name",),
    "optimization": ("key",),
}
ANY_KEY = "key"

# a quantity's type, by the parser its YAML goes through (pipelines/units.py)
UNITS = {
    units.parse_duration: ("duration (s)", "seconds: a number, or one with a unit: "
                                           + ", ".join(u for u in units.DURATION_UNITS if u)
                                           + " (`90s`, `10m`, `100us`)"),
    units.parse_size: ("size (bytes)", "bytes: a number, or one with a unit: "
                                       + ", ".join(u for u in units.SIZE_UNITS if u)
                                       + " (`512MiB`, `2GiB`; `kb`/`mb`/`gb` are powers of 1000, `kib`/`mib`/`gib` of "
                                         "1024; any case)"),
    units.parse_fraction: ("fraction", "a share: a percentage (`10%`) or a number (`0.1`)"),
}


@dataclass(frozen=True)
class Option:
    path: tuple[str, ...]
    type: str
    default: str | None  # as YAML; None: required; "": none (keys of yours)
    description: str
    examples: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return ".".join(self.path).replace("." + LIST, LIST)

    def matches(self, path: tuple[str, ...]) -> bool:
        """Whether a key path of a pipeline file (its list items as LIST) names this option or one inside it."""
        return len(path) <= len(self.path) and all(
            mine == theirs or (mine.startswith("<") and theirs != LIST) for mine, theirs in zip(self.path, path))


@dataclass(frozen=True)
class Section:
    title: str
    summary: str
    options: list[Option]
    kind: Kind | None = None  # the stage kind that reads these options


def options(model: type[BaseModel], prefix: tuple[str, ...] = (), extra_keys: tuple[str, ...] = (),
            nested: bool = True, skip: frozenset[str] = frozenset()) -> list[Option]:
    """A row for every field of `model` and, if `nested`, every field of the models inside it."""
    rows: list[Option] = []
    for name, info in model.model_fields.items():
        if name in skip:
            continue
        path = prefix + (info.alias or name,)
        keys = KEYS.get(name, ())
        annotation = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
        rows.append(Option(path, _type(annotation, iter(keys)), _default(info),
                           info.description or _doc(_model_in(info.annotation)),
                           tuple(_yaml(e) for e in info.examples or ())))
        if nested:
            rows += _inside(info.annotation, path, iter(keys))
    extra = _extra(model)
    if extra is not None:
        placeholder = f"<{next(iter(extra_keys), ANY_KEY)}>"
        rows.append(Option(prefix + (placeholder,), _type(extra.annotation, iter(())), "", extra.description or "",
                           tuple(_yaml(e) for e in extra.examples or ())))
    return rows


def _inside(annotation: Any, path: tuple[str, ...], keys: Iterator[str]) -> list[Option]:
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return _inside(args[0], path, keys)
    if origin in (Union, types.UnionType):
        return [row for arg in args for row in _inside(arg, path, keys)]
    if origin is list:
        return _inside(args[0], path + (LIST,), keys)
    if origin is dict:
        return _inside(args[1], path + (_key(args[0], keys),), keys)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return options(annotation, path, tuple(keys))
    return []


def _extra(model: type[BaseModel]) -> FieldInfo | None:
    """The type of a model's own extra keys where it declares one (`__pydantic_extra__: dict[str, ...]`)."""
    if model.model_config.get("extra") != "allow":
        return None
    hint = get_type_hints(model, vars(sys.modules[model.__module__]), include_extras=True).get("__pydantic_extra__")
    if hint is None:
        return FieldInfo(annotation=Any)
    value = get_args(hint)[1]
    return FieldInfo.from_annotation(value)


def _type(annotation: Any, keys: Iterator[str]) -> str:
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        unit = next((UNITS[m.func][0] for m in args[1:] if isinstance(m, BeforeValidator) and m.func in UNITS), None)
        return unit or _type(args[0], keys)
    if origin in (Union, types.UnionType):
        parts: list[str] = []
        for arg in args:
            if arg is not type(None) and (shown := _type(arg, keys)) not in parts:
                parts.append(shown)
        if "int" in parts and "float" in parts:
            parts[parts.index("int")] = "number"
            parts.remove("float")
        return " | ".join(parts)
    if origin is Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin is list:
        return f"list[{_type(args[0], keys)}]"
    if origin is dict:
        return f"{{{_key(args[0], keys)}: {_type(args[1], keys)}}}"
    if annotation is Any:
        return "any"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "object"
    return getattr(annotation, "__name__", str(annotation))


def _key(annotation: Any, keys: Iterator[str]) -> str:
    """A mapping's key as its rows show it: the keys it takes where they are fixed, else a placeholder."""
    if get_origin(annotation) is Literal:
        return _type(annotation, keys)
    return f"<{next(keys, ANY_KEY)}>"


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for a in get_args(annotation) if (m := _model_in(a)) is not None), None)


def _doc(model: type[BaseModel] | None) -> str:
    """The first paragraph of a model's docstring: the description of an option holding it that has none."""
    doc = (model.__doc__ or "") if model is not None else ""
    return " ".join(doc.strip().split("\n\n")[0].split())


def _default(info: FieldInfo) -> str | None:
    if info.is_required():
        return None
    value = info.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json", exclude_unset=True)
    return _yaml(value)


def _yaml(value: Any) -> str:
    """A value as a pipeline file writes it, on one line."""
    text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=1 << 20, allow_unicode=True).strip()
    return text.removesuffix("\n...").strip()


def _summary(kind: Kind) -> str:
    doc = sys.modules[kind.params.__module__].__doc__ or ""
    first = " ".join(doc.strip().split("\n\n")[0].split())
    first = re.sub(r"^Stage `[^`]+`: ", "", first)
    return first[:1].upper() + first[1:]


def sections() -> list[Section]:
    """The pipeline file's own keys, those of every stage, then each kind's (pipelines/kinds.py's order)."""
    common = frozenset(StageBase.model_fields)
    out = [Section("The pipeline file", "The keys at the top of the file.", options(Pipeline, nested=False)),
           Section("Every stage", "Keys every stage takes besides its kind's: when it runs, what it reads.",
                   options(StageBase))]
    for kind in (*KINDS.values(), USER):
        title = kind.name if kind is not USER else "Your own stage"
        rows = options(kind.params, skip=common)
        rows.sort(key=lambda o: o.path != ("kind",))  # first, as files write it (build's inherited options precede it)
        out.append(Section(title, _summary(kind), rows, kind))
    return out


def _slot(name: str, slot: Slot) -> str:
    kinds = [k for k in slot.prefer if k != ANY_KIND]
    named = ", ".join(kinds[:-1]) + " or " + kinds[-1] if len(kinds) > 1 else "".join(kinds)
    if slot.prefer:
        default = f"{'every' if slot.many else 'the nearest'} earlier {named + ' ' if named else ''}stage"
        default += ", else the pipeline's model" if slot.source_ok else ""
    else:
        default = "the pipeline's model" if slot.source_ok else "none"
    many = "one or several " if slot.many else ""
    need = "required" if slot.required else "optional"
    return f"- {markdown.code(name)}: {many}{markdown.code(slot.type)}, {need}; default: {markdown.text(default)}"


def _wiring(kind: Kind) -> list[str]:
    spec = kind.params.model_construct()
    slots = kind.slots_for(spec)
    lines = [f"Read by every stage with {markdown.code('kind: ' + kind.name)}."
             if kind is not USER else "Read by every stage whose `kind` is a function of yours."]
    lines += ["", "Inputs (`inputs:` slots; an omitted one gets its default):" if slots else "Inputs: none."]
    lines += [_slot(name, slot) for name, slot in slots.items()]
    outputs = kind.outputs_for(spec)
    produced = ", ".join(f"{markdown.code(name)} ({markdown.code(t)})" for name, t in outputs.items())
    if kind is USER:
        produced = "those declared under `outputs`"
    elif kind.more_outputs is not _FIELDS["more_outputs"].default:
        produced += ", and more with some settings (see the options)"
    return lines + ["", f"Outputs: {produced or 'none'}."]


_FIELDS = {f.name: f for f in dataclasses.fields(Kind)}
_CODE = re.compile(r"(`+)(.+?)\1")


def _prose(value: str) -> str:
    """A description in a table cell: literal text, its `code` spans kept as code."""
    out, at = [], 0
    for m in _CODE.finditer(value):
        out += [markdown.text(value[at:m.start()]), markdown.code(m.group(2), cell=True)]
        at = m.end()
    return "".join(out + [markdown.text(value[at:])])


def _table(rows: list[Option]) -> list[str]:
    lines = ["| Key | Type | Default | Description | Example |", "|---|---|---|---|---|"]
    for o in rows:
        default = "required" if o.default is None else markdown.code(o.default, cell=True) if o.default else ""
        examples = "<br>".join(markdown.code(e, cell=True) for e in o.examples)
        lines.append(f"| {markdown.code(o.key, cell=True)} | {markdown.code(o.type, cell=True)} | {default} | "
                     f"{_prose(o.description)} | {examples} |")
    return lines


def _anchor(title: str) -> str:
    return re.sub(r"[^a-z0-9 -]", "", title.lower()).replace(" ", "-")


def render() -> str:
    """docs/reference.md."""
    parts = sections()
    lines = [
        f"<!-- Generated by `{COMMAND}` from the parameter models (pipelines/pipeline.py, pipelines/schema.py, "
        f"pipelines/params/): do not edit; change the models and run it again. -->",
        "",
        "# Pipeline options",
        "",
        "Every key a pipeline file takes, generated from the models that validate it. A stage "
        "(`stages.<stage>`) reads the keys of its kind's section (a stage with `kind: build` those under "
        "[build](#build)) and those of [every stage](#every-stage). The JSON Schema "
        "[`examples/trtflow.schema.json`](../examples/trtflow.schema.json) (`trtflow schema`) is the same, "
        "machine-readable, for editors; `trtflow validate` checks a file against both.",
        "",
        "Key paths: `a.b` is the key `b` inside `a`; `a[].b` the key `b` in each item of the list `a`; "
        "`<output>` (or `<input>`, `<profile>`, ...) a name of yours. A default of `{}` is the nested keys' own "
        "defaults.",
        "",
        "Quantities:",
        "",
        *[f"- {markdown.code(shown)}: {meaning}" for shown, meaning in UNITS.values()],
        "",
        *[f"- [{s.title}](#{_anchor(s.title)})" for s in parts],
    ]
    for s in parts:
        lines += ["", f"## {s.title}", "", markdown.text(s.summary) if s.kind is None else _prose(s.summary)]
        if s.kind is not None:
            lines += ["", *_wiring(s.kind)]
        lines += ["", *_table(s.options)]
    return "\n".join(lines) + "\n"
