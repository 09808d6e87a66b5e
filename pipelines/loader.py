"""Load a pipeline YAML: parse with line numbers, interpolate ${ENV}, apply --set, validate.

Every failure is a ``SpecError`` naming the file, the line and the key path.
"""
from __future__ import annotations

import os
import re
import stat
import types
import typing
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from trtflow import depends
from trtflow.errors import SpecError
from trtflow.pipelines.kinds import KINDS, kind_named
from trtflow.pipelines.pipeline import Pipeline
from trtflow.pipelines.schema import StageBase
from trtflow.secrets import holds_secret
from trtflow.text import first_line, suggestion
from trtflow.usercode import code_beside
from trtflow.yaml_text import LINE_BREAKS, UNSAFE_OUTSIDE_QUOTES

Path_ = tuple  # a key path such as ("stages", "build", "workspace")


@dataclass
class LoadedPipeline:
    spec: Pipeline
    file: Path  # the YAML file, absolute
    lines: dict[Path_, int] = field(default_factory=dict)

    @property
    def base_dir(self) -> Path:
        return self.file.parent

    @property
    def model_path(self) -> Path:
        return _through_links(self.base_dir / self.spec.model)

    @property
    def store_root(self) -> Path:
        return _through_links(self.base_dir / (self.spec.artifacts or ".trtflow"))

    @property
    def store_location(self) -> str:
        """`artifacts:` as given when it is a URL (`s3://bucket/prefix`), else the store's directory."""
        return self.spec.artifacts if is_url(self.spec.artifacts) else str(self.store_root)

    def line_of(self, path: Path_) -> int | None:
        return _line_for(self.lines, path)

    def error(self, message: str, path: Path_, hint: str | None = None) -> SpecError:
        return SpecError(message, file=str(self.file), line=self.line_of(path), path=path, hint=hint)


def _through_links(path: Path) -> Path:
    """`path` resolved; the path as written goes to the keys' ledger (a link retargeted is a change)."""
    depends.READ.file(path)
    return path.resolve()


def load_pipeline(file: str | os.PathLike, overrides: list[str] | None = None,
                  environ: dict[str, str] | None = None, check_files: bool = True) -> LoadedPipeline:
    path = Path(file)
    shown = str(file)
    return load_text(read_pipeline_text(path, shown), path, overrides, environ, check_files)


def load_text(text: str, path: Path, overrides: list[str] | None = None, environ: dict[str, str] | None = None,
              check_files: bool = True) -> LoadedPipeline:
    """`load_pipeline` of `text` as if read from `path` (init checks the file it is about to write)."""
    shown = str(path)
    size = len(text.encode())
    if size > MAX_PIPELINE_BYTES:
        raise SpecError(f"the pipeline file is {size / 2**20:.1f} MiB; a pipeline file is at most "
                        f"{MAX_PIPELINE_BYTES // 2**20} MiB", file=shown, hint="is this the right file?")
    data, lines = parse_yaml(text, shown)
    if not isinstance(data, dict):
        raise SpecError("the pipeline must be a YAML mapping with version, name, model and stages", file=shown,
                        line=1)
    code_beside(path)  # the user's own code beside it: importable at validate, plan and run (trtflow.usercode)
    data = _interpolate(data, (), environ if environ is not None else os.environ, shown, lines)
    for item in overrides or []:
        overridden = _apply_override(data, item)
        # errors in an overridden value point at the --set, not at a line of the file
        lines = {k: v for k, v in lines.items() if k[:len(overridden)] != overridden}
        lines[overridden] = 0

    spec = validate(data, shown, lines)
    loaded = LoadedPipeline(spec=spec, file=path.resolve(), lines=lines)
    if is_url(spec.artifacts) and holds_secret(spec.artifacts):
        raise loaded.error(f"artifacts: the store's URL holds a secret (not repeated here): {NO_SECRET_IN_URL}",
                           ("artifacts",), hint=STORE_CREDENTIALS_HINT)
    why = None if is_url(spec.artifacts) else unsafe_store_root(loaded.store_root)
    if why:
        raise loaded.error(f"'{spec.artifacts}' {why}", ("artifacts",),
                           hint="use a directory of its own, e.g. .trtflow beside the pipeline file")
    if check_files and not loaded.model_path.is_file():
        raise loaded.error(f"model file '{spec.model}' not found (looked at {loaded.model_path})", ("model",),
                           hint="fix the path; it is relative to the pipeline file")
    return loaded


_SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/run", "/sbin",
                 "/sys", "/usr")
_SYSTEM_DIRS = ("/", "/home", "/media", "/mnt", "/opt", "/root", "/srv", "/tmp", "/var")


NO_SECRET_IN_URL = "a store's location is printed, recorded with every result and posted to Prefect"
STORE_CREDENTIALS_HINT = ("give the credentials through TRTFLOW_STORE_CREDENTIALS (a Prefect block) or the "
                          "backend's own variables (AWS_ACCESS_KEY_ID, ...), and the URL without them")


def is_url(location: str | Path | None) -> bool:
    """A store location given as a URL (`s3://bucket/prefix`, any fsspec protocol), not a directory."""
    return isinstance(location, str) and re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", location) is not None


def unsafe_store_root(root: Path) -> str | None:
    """Why `root` must not be an artifact store (a system directory, or a directory many things share)."""
    root = Path(os.path.abspath(root))
    if str(root) in _SYSTEM_DIRS or root == Path.home():
        return f"resolves to {root}, a directory shared with everything else: the store would write stage " \
               f"directories into it"
    for tree in _SYSTEM_TREES:
        if root == Path(tree) or root.is_relative_to(tree):
            return f"resolves to {root}, inside the system directory {tree}"
    return None


def read_pipeline_text(path: Path, shown: str) -> str:
    """The pipeline file's text, read only if it is a regular file of at most MAX_PIPELINE_BYTES (a FIFO hung
    `validate`, /dev/zero ran out of memory, a 50 MB file parsed for minutes)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise SpecError("pipeline file not found", file=shown) from None
    except OSError as exc:
        raise SpecError(f"cannot read the pipeline file: {exc.strerror or exc}", file=shown) from None
    if not stat.S_ISREG(st.st_mode):
        raise SpecError("the pipeline file is not a regular file (a directory, FIFO or device)", file=shown,
                        hint="give the path of a YAML file")
    if st.st_size > MAX_PIPELINE_BYTES:
        raise SpecError(f"the pipeline file is {st.st_size / 2**20:.1f} MiB; a pipeline file is at most "
                        f"{MAX_PIPELINE_BYTES // 2**20} MiB", file=shown, hint="is this the right file?")
    depends.READ.file(path)
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_PIPELINE_BYTES + 1)
        text = raw.decode("utf-8")
    except OSError as exc:
        raise SpecError(f"cannot read the pipeline file: {exc.strerror or exc}", file=shown) from None
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise SpecError(f"the pipeline file is not UTF-8 text (byte {exc.start})", file=shown, line=line) from None
    return text


# --- YAML with line numbers ------------------------------------------------------------------------------------

MAX_PIPELINE_BYTES = 2**20  # a pipeline file is a few KB
MAX_YAML_NODES = 100_000  # a pipeline file has hundreds; an alias bomb expands to billions
MAX_YAML_DEPTH = 64  # nesting of mappings and sequences; PyYAML's composer recurses (RecursionError at ~1000)
CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x84\x86-\x9f]")
# YAML's line breaks beyond CR and LF (NEL U+0085, U+2028, U+2029) and the bidirectional embeddings, overrides,
# isolates and marks: outside a quoted string each makes a line parse, or show in a terminal, other than it reads (a
# comment that ends early and defines a stage); inside one they are data. The set is the writer's (yaml_text.py).
BREAKS_AND_BIDI = re.compile(f"[{UNSAFE_OUTSIDE_QUOTES}]")
BOM = "\ufeff"  # allowed as the file's first character only (an editor's byte order mark)


def _check_text(text: str, shown: str) -> None:
    """Control characters and nesting, before PyYAML composes (which recurses per level of nesting)."""
    bad = CONTROL.search(text)
    if bad:
        line = text.count("\n", 0, bad.start()) + 1
        raise SpecError(f"control character U+{ord(bad.group()):04X} (YAML allows none)", file=shown,
                        line=line, hint="remove it" if shown.startswith("--set") else "remove it; a binary file given as the pipeline?")
    _check_breaks(text, shown)
    depth = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_YAML_DEPTH:
                    raise SpecError(f"YAML nested more than {MAX_YAML_DEPTH} levels deep", file=shown,
                                    line=event.start_mark.line + 1, hint="a pipeline file nests a few levels")
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
    except yaml.YAMLError:
        return  # parse_yaml reports it with its line


def _check_breaks(text: str, shown: str) -> None:
    found = [m.start() for m in BREAKS_AND_BIDI.finditer(text) if m.start() > 0 or m.group() != BOM]
    if not found:
        return
    spans = _quoted_spans(text)
    for at in found:
        if not any(start < at < end for start, end in spans):
            ch = text[at]
            what = unicodedata.name(ch, "NEXT LINE")
            raise SpecError(f"U+{ord(ch):04X} ({what}) outside a quoted string: "
                            + ("YAML reads it as a line break" if ch in LINE_BREAKS else
                               "a terminal shows the line other than it parses"), file=shown, line=text.count("\n", 0, at) + 1,
                            hint=f"remove it; in a double-quoted string write it as the escape \"\\u{ord(ch):04x}\"")


def _quoted_spans(text: str) -> list[tuple[int, int]]:
    """Where the quoted scalars are (character offsets), as far as the text scans."""
    spans = []
    try:
        for token in yaml.scan(text, Loader=yaml.SafeLoader):
            if isinstance(token, yaml.ScalarToken) and token.style in ("'", '"'):
                spans.append((token.start_mark.index, token.end_mark.index))
    except yaml.YAMLError:
        pass  # what follows a syntax error is in no string
    return spans


def parse_yaml(text: str, shown: str) -> tuple[Any, dict[Path_, int]]:
    """The data and the line of every key path. Composed once, then checked before anything expands aliases:
    an alias bomb, an alias inside itself and a key given twice are errors, not silently accepted or fatal."""
    try:
        data, node = _compose(text, shown)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(f"YAML syntax error: {problem}", file=shown,
                        line=mark.line + 1 if mark else None, hint="fix the YAML syntax") from None
    lines: dict[Path_, int] = {}
    if node is not None:
        _collect_lines(node, (), lines)
    return data, lines


def _compose(text: str, shown: str) -> tuple[Any, yaml.Node | None]:
    """(data, root node) of YAML `text`, within the limits on characters, depth and size (SpecError), with
    YAMLError for a syntax error. Pipeline files and `--set` values alike."""
    _check_text(text, shown)
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None:
            _check_node(node, shown)
        return (loader.construct_document(node) if node is not None else None), node
    finally:
        loader.dispose()


def _check_node(root: yaml.Node, shown: str) -> None:
    size: dict[int, int] = {}  # expanded size of each node, aliases counted every time they are used
    on_path: set[int] = set()

    def walk(node: yaml.Node, path: Path_) -> int:
        if id(node) in on_path:
            raise SpecError("an alias refers to a node that contains it (a YAML structure inside itself)",
                            file=shown, line=node.start_mark.line + 1, path=path, hint="remove the alias")
        if id(node) in size:
            return size[id(node)]
        on_path.add(id(node))
        total = 1
        if isinstance(node, yaml.MappingNode):
            seen: dict[str, int] = {}
            for key_node, value_node in node.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                    line = key_node.start_mark.line + 1
                    if key_node.value in seen:
                        raise SpecError(f"key '{key_node.value}' is given twice (first on line "
                                        f"{seen[key_node.value]}); YAML would keep only the last", file=shown,
                                        line=line, path=path, hint="remove or rename one of them")
                    seen[key_node.value] = line
                total += walk(key_node, path) + walk(value_node, path + (str(key_node.value),))
        elif isinstance(node, yaml.SequenceNode):
            total += sum(walk(item, path + (i,)) for i, item in enumerate(node.value))
        on_path.discard(id(node))
        if total > MAX_YAML_NODES:
            raise SpecError(f"the YAML expands to more than {MAX_YAML_NODES} nodes through aliases "
                            f"(an alias bomb?)", file=shown, line=node.start_mark.line + 1, path=path,
                            hint="use fewer aliases")
        size[id(node)] = total
        return total

    walk(root, ())


def _collect_lines(node: yaml.Node, path: Path_, lines: dict[Path_, int]) -> None:
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = path + (key_node.value,)
            lines[key] = key_node.start_mark.line + 1
            _collect_lines(value_node, key, lines)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _collect_lines(item, path + (i,), lines)


def _line_for(lines: dict[Path_, int], path: Path_) -> int | None:
    for n in range(len(path), -1, -1):
        if path[:n] in lines:
            return lines[path[:n]]
    return None


# --- ${ENV} and --set ------------------------------------------------------------------------------------------

_ENV = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _interpolate(value: Any, path: Path_, environ, shown: str, lines) -> Any:
    if isinstance(value, dict):
        return {k: _interpolate(v, path + (k,), environ, shown, lines) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, path + (i,), environ, shown, lines) for i, v in enumerate(value)]
    if not isinstance(value, str) or "$" not in value:
        return value

    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name, default = m.group(1), m.group(2)
        depends.READ.variable(name, environ.get(name))
        if name in environ:
            return environ[name]
        if default is not None:
            return default
        raise SpecError(f"environment variable {name} is not set", file=shown, line=_line_for(lines, path),
                        path=path, hint=f"export {name}=... or write ${{{name}:-default}}")

    return _ENV.sub(sub, value)


def _apply_override(data: dict, item: str) -> Path_:
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise SpecError(f"--set {item!r}: expected KEY.PATH=VALUE, e.g. stages.build.workspace=2GiB",
                        file="--set")
    try:
        # the value is held to a pipeline file's limits: an alias bomb here expanded in the params model
        value = _compose(raw, f"--set {key.strip()}")[0] if raw.strip() else ""
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or first_line(exc)
        where = getattr(exc, "problem_mark", None)
        at = f" at column {where.column + 1}" if where is not None else ""
        raise SpecError(f"the value {raw!r} is not valid YAML: {problem}{at}", line=0,
                        path=tuple(key.strip().split(".")), hint=f"quote it to pass a string: --set '{key.strip()}=\"...\"'") from None
    parts: list[Any] = key.strip().split(".")
    node: Any = data
    for i, part in enumerate(parts[:-1]):
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
            continue
        if not isinstance(node, dict):
            raise SpecError(f"--set {key}: '{'.'.join(parts[:i])}' is not a mapping", file="--set")
        node = node.setdefault(part, {})
    last = parts[-1]
    if isinstance(node, list) and last.isdigit() and int(last) < len(node):
        node[int(last)] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise SpecError(f"--set {key}: '{'.'.join(parts[:-1])}' is not a mapping", file="--set")
    return tuple(int(p) if p.isdigit() else p for p in parts)


# --- validation ------------------------------------------------------------------------------------------------

def validate(data: dict, shown: str, lines: dict[Path_, int]) -> Pipeline:
    stages = data.get("stages")
    validated: dict[str, StageBase] = {}
    if isinstance(stages, dict):
        for name, raw in stages.items():
            path = ("stages", name)
            if not isinstance(raw, dict):
                raise SpecError("a stage must be a mapping with a 'kind'", file=shown,
                                line=_line_for(lines, path), path=path)
            kind = raw.get("kind")
            if kind is None:
                raise SpecError("missing required key 'kind'", file=shown, line=_line_for(lines, path), path=path,
                                hint=f"one of {', '.join(KINDS)}, or package.module:function")
            row = kind_named(str(kind))
            if row is None:
                hint = suggestion(str(kind), list(KINDS)) or \
                    f"kinds: {', '.join(KINDS)}, or package.module:function for your own stage"
                raise SpecError(f"unknown stage kind '{kind}'", file=shown, line=_line_for(lines, path + ("kind",)),
                                path=path + ("kind",), hint=hint)
            model = row.params
            try:
                validated[name] = model.model_validate(raw)
            except ValidationError as exc:
                raise _convert(exc, model, raw, path, shown, lines) from None
    try:
        return Pipeline.model_validate({**data, "stages": validated if isinstance(stages, dict) else stages})
    except ValidationError as exc:
        raise _convert(exc, Pipeline, data, (), shown, lines) from None


def _convert(exc: ValidationError, model: type[BaseModel], data: Any, prefix: Path_, shown: str,
             lines: dict[Path_, int]) -> SpecError:
    err = exc.errors()[0]
    path = _data_path(data, err["loc"])
    full = prefix + path
    more = len(exc.errors()) - 1
    hint = f"and {more} more problem{'s' if more > 1 else ''}" if more else None
    if err["type"] == "extra_forbidden":
        allowed = _fields_at(model, path[:-1])
        fix = suggestion(str(path[-1]), allowed) or (f"allowed: {', '.join(allowed)}" if allowed else None)
        return SpecError(f"unknown key '{path[-1]}'", file=shown, line=_line_for(lines, full), path=full[:-1],
                         hint=fix if not more else f"{fix}; {hint}" if fix else hint)
    if err["type"] == "missing":
        return SpecError(f"missing required key '{path[-1]}'", file=shown, line=_line_for(lines, full[:-1]),
                         path=full[:-1] or None, hint=hint)
    msg = err["msg"].removeprefix("Value error, ")
    got = err.get("input")
    if err["type"] not in ("value_error", "assertion_error") and not isinstance(got, (dict, list)):
        msg += f", got {got!r}"
    return SpecError(msg, file=shown, line=_line_for(lines, full), path=full or None, hint=hint)


def _data_path(data: Any, loc: tuple) -> Path_:
    """Pydantic locations include union-branch labels; keep only the parts that exist in the data."""
    out: list[Any] = []
    node = data
    for part in loc:
        if isinstance(node, dict) and part in node:
            out.append(part)
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            out.append(part)
            node = node[part]
        elif isinstance(node, dict) and isinstance(part, str) and not _is_branch_label(part):
            out.append(part)  # a missing or extra key
            node = None
    return tuple(out)


def _is_branch_label(part: str) -> bool:
    return bool(re.search(r"[\[\]()]", part)) or part[:1].isupper()


def _fields_at(model: Any, path: Path_) -> list[str]:
    """The keys allowed at `path` inside `model` (for 'did you mean')."""
    current: list[Any] = [model]
    for part in path:
        nxt: list[Any] = []
        for tp in current:
            for t in _unwrap(tp):
                if isinstance(t, type) and issubclass(t, BaseModel):
                    f = t.model_fields.get(part) or next(
                        (fi for fi in t.model_fields.values() if fi.alias == part), None)
                    if f is not None:
                        nxt.append(f.annotation)
                elif typing.get_origin(t) in (dict, list):
                    nxt.append(typing.get_args(t)[-1])
        current = nxt
    names: list[str] = []
    for tp in current:
        for t in _unwrap(tp):
            if isinstance(t, type) and issubclass(t, BaseModel):
                names += [fi.alias or n for n, fi in t.model_fields.items()]
    return sorted(set(names))


def _unwrap(tp: Any) -> list[Any]:
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        return [u for a in typing.get_args(tp) for u in _unwrap(a)]
    return [tp]
