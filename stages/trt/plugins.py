"""TensorRT plugins a pipeline declares (`plugins:`): found on disk for the stage keys (`found`), handed to the
children that parse or build (`declared`, set around a stage's function by `Declaring`), and loaded there before
the parse (`load`).

TensorRT-RTX (1.7, the tensorrt-rtx-cu13 wheel) `dlopen`s the unversioned `libtensorrt_rtx.so` as soon as the
parser adds any plugin layer, and the wheel ships only `libtensorrt_rtx.so.1`: the process aborts
(std::terminate). The dynamic loader reads LD_LIBRARY_PATH once, when a process starts, so the fix is a folder of
trtflow's own holding the link `libtensorrt_rtx.so -> <the wheel's libtensorrt_rtx.so.1>` (`library_link_dir`),
first on the LD_LIBRARY_PATH of every child that parses or builds (`child_env`). NVIDIA's ONNX Runtime
TensorRT-RTX package makes the same link. Nothing is written into site-packages.

A plugin is a shared library (its creators registered by TensorRT's loader, or by its own entry function taking
(logger, namespace)) or a Python module of the user's that registers `IPluginCreatorV3One` creators when imported.
Engines built with a plugin need the same plugin loaded wherever they are deserialized.
"""
from __future__ import annotations

import contextvars
import ctypes
import hashlib
import importlib
import importlib.machinery
import importlib.util
import os
import re
import secrets
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from trtflow import settings
from trtflow.errors import StageError, format_path
from trtflow.text import first_line

if TYPE_CHECKING:
    from trtflow.pipelines.loader import LoadedPipeline
    from trtflow.stages.trt.records import Backend

# flavour -> (the wheel's package of native libraries, the unversioned name the library is dlopened by)
UNVERSIONED = {"tensorrt-rtx": ("tensorrt_rtx_libs", "libtensorrt_rtx.so")}
LINKS = "tensorrt-links"  # under trtflow's cache folder: one folder per library linked to


class PluginError(StageError):
    """A declared plugin cannot be found or loaded: one line naming its key path (`plugins[0]`)."""


class PluginLoad(BaseModel):
    """A declared plugin as found on disk, what a child needs to load it (absolute paths)."""
    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str  # its key path in the pipeline file: "plugins[0]"
    label: str  # as declared: "python myplugin", "library lib/libmine.so (entry initMine)"
    file: str  # the shared library, or the module's source file
    digest: str  # the file's sha256 when the stage's key was made
    python: str | None = None  # the module imported (else `file` is a library)
    root: str | None = None  # the import-path folder the module was found in
    entry: str | None = None  # the library's function taking (logger, namespace) that registers its creators
    namespace: str = ""  # the namespace handed to `entry`

    def failed(self, why: str) -> PluginError:
        return PluginError(f"{self.key} ({self.label}) did not load: {why}")


# --- the pipeline's declarations, found on disk (the runner's side) ---------------------------------------------

def found(loaded: LoadedPipeline, sha256: Callable[[Path], str]) -> list[PluginLoad]:
    """The pipeline's `plugins:`, each found on disk (relative paths from the pipeline file's folder) without running
    any of it, with its file's digest (`sha256`: the runner's digest cache): a library that is not a regular file,
    or a module not on the import path, is the SpecError of its key path."""
    return [_library(loaded, i, p, sha256) if p.library is not None else _module(loaded, i, p, sha256)
            for i, p in enumerate(loaded.spec.plugins)]


def fingerprint(plugins: list[PluginLoad]) -> str:
    """What the plugins add to the key of anything built with them (an engine cache's cell): "" for none."""
    if not plugins:
        return ""
    return hashlib.sha256("\n".join(f"{p.label}\0{p.digest}" for p in plugins).encode()).hexdigest()


def _library(loaded: LoadedPipeline, i: int, plugin: Any, sha256: Callable[[Path], str]) -> PluginLoad:
    path = Path(plugin.library)
    path = path if path.is_absolute() else loaded.base_dir / path
    if not path.is_file():
        raise loaded.error(f"plugin library '{plugin.library}' is not a file (looked at {path})",
                           ("plugins", i, "library"), hint="the path is relative to the pipeline file")
    entry = f" (entry {plugin.entry})" if plugin.entry else ""
    return PluginLoad(key=format_path(("plugins", i)), label=f"library {plugin.library}{entry}", file=str(path),
                      digest=sha256(path), entry=plugin.entry, namespace=plugin.namespace)


def _module(loaded: LoadedPipeline, i: int, plugin: Any, sha256: Callable[[Path], str]) -> PluginLoad:
    from trtflow import depends

    # the import path, then this pipeline's folder (appended: never shadowing an installed package), and not the
    # folders of other pipelines this process loaded
    where = list(dict.fromkeys([*sys.path, str(loaded.base_dir)]))
    depends.READ.import_path(where)  # a module of that name made anywhere on it may shadow this one
    location = find_module(plugin.python, where)
    if location is None:
        raise loaded.error(f"no Python module '{plugin.python}' on the import path", ("plugins", i, "python"),
                           hint="put it beside the pipeline file, or install it")
    root, source = location
    return PluginLoad(key=format_path(("plugins", i)), label=f"python {plugin.python}", file=source,
                      digest=sha256(Path(source)), python=plugin.python, root=root)


def find_module(name: str, path: list[str]) -> tuple[str, str] | None:
    """(the folder of `path` it is found in, its file) of module `name`, found as `import` would on `path`, without
    running any of its code (not even its packages' `__init__`); None where there is no such file."""
    parts, locations, root = name.split("."), list(path), None
    spec = None
    for depth, part in enumerate(parts):
        spec = importlib.machinery.PathFinder.find_spec(part, locations)
        if spec is None:
            return None
        inner = list(spec.submodule_search_locations or [])
        if depth == 0:
            root = str(Path(inner[0]).parent) if inner else str(Path(spec.origin or "").parent)
        locations = inner
    if spec is None or not spec.has_location or not spec.origin:
        return None
    return root or "", spec.origin


# --- what reaches the stage's process and its children ----------------------------------------------------------

_DECLARED: contextvars.ContextVar[tuple[PluginLoad, ...]] = contextvars.ContextVar("trtflow_plugins", default=())


def declared() -> list[PluginLoad]:
    """The plugins of the pipeline whose stage runs here (none outside a stage, or for a stage without TensorRT)."""
    return list(_DECLARED.get())


@dataclass(frozen=True)
class Declaring:
    """A stage's function, run with the pipeline's plugins declared (it crosses into the stage's process pickled)."""
    plugins: tuple[PluginLoad, ...]
    function: Callable[..., Any]

    def __call__(self, *args: Any) -> Any:
        token = _DECLARED.set(self.plugins)
        try:
            return self.function(*args)
        finally:
            _DECLARED.reset(token)


# --- the link TensorRT-RTX needs, and the children's environment -------------------------------------------------

def cache_dir() -> Path:
    """`$TRTFLOW_CACHE_DIR`, else `$XDG_CACHE_HOME/trtflow` (`~/.cache/trtflow`)."""
    return settings.CACHE_DIR.get() or Path(os.getenv("XDG_CACHE_HOME") or Path.home() / ".cache") / "trtflow"


def versioned_library(backend: Backend) -> Path | None:
    """The wheel's versioned library (`.../tensorrt_rtx_libs/libtensorrt_rtx.so.1`) where its flavour's wheel lacks
    the unversioned name; None where nothing needs linking (another flavour, a system install, a wheel that has it).
    Found without importing the package (importing it loads the libraries)."""
    package, name = UNVERSIONED.get(backend.flavour, (None, ""))
    try:
        spec = importlib.util.find_spec(package) if package else None
    except (ImportError, ValueError):
        spec = None
    folders = list(spec.submodule_search_locations or []) if spec else []
    if not folders or (Path(folders[0]) / name).exists():
        return None
    found = sorted(p for p in Path(folders[0]).glob(f"{name}.*") if re.fullmatch(re.escape(name) + r"\.\d+", p.name))
    return found[0].resolve() if found else None


def library_link_dir(backend: Backend) -> Path | None:
    """The folder of trtflow's own holding `libtensorrt_rtx.so -> <the wheel's libtensorrt_rtx.so.1>` (None: no
    link needed). The link is made beside it and renamed into place, and checked: whatever was at its name (a link
    to elsewhere, a file) is replaced by the rename, never followed or written through."""
    target = versioned_library(backend)
    if target is None:
        return None
    folder = cache_dir() / LINKS / hashlib.sha256(str(target).encode()).hexdigest()[:16]
    _own_folder(folder)
    link = folder / UNVERSIONED[backend.flavour][1]
    if _points_at(link, target):
        return folder
    staged = folder / f".{link.name}.{os.getpid()}.{secrets.token_hex(4)}"
    os.symlink(target, staged)
    try:
        os.replace(staged, link)
    finally:
        if os.path.lexists(staged):
            os.unlink(staged)
    if not _points_at(link, target):
        raise PluginError(f"{link} does not stay a link to {target} (something else writes there)",
                          hint="remove the folder, or set TRTFLOW_CACHE_DIR to a folder of your own")
    return folder


def _points_at(link: Path, target: Path) -> bool:
    try:
        return os.readlink(link) == str(target)
    except OSError:  # missing, or not a link
        return False


def _own_folder(folder: Path) -> None:
    """`folder` made, or checked to be this user's own real folder that no one else can write to (a library found
    there is loaded); a link planted in its place is removed (the link only), never followed."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(2):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
        st = os.lstat(folder)
        if not stat.S_ISLNK(st.st_mode):
            break
        os.unlink(folder)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise PluginError(f"{folder} is not a folder of this user's that only they can write to",
                          hint="remove it, or set TRTFLOW_CACHE_DIR to a folder of your own")


def child_env(backend: Backend, plugins: list[PluginLoad]) -> dict[str, str]:
    """What a child that parses or builds adds to its environment: the link's folder first on LD_LIBRARY_PATH. With
    no plugin declared, a link that cannot be made is left out (only a plugin layer needs it); with one, it raises."""
    try:
        folder = library_link_dir(backend)
    except OSError as exc:
        if not plugins:
            return {}
        raise PluginError(f"plugins: the link TensorRT-RTX loads plugins through could not be made ({exc})",
                          hint="set TRTFLOW_CACHE_DIR to a folder you can write to") from None
    except PluginError:
        if not plugins:
            return {}
        raise
    if folder is None:
        return {}
    rest = os.getenv("LD_LIBRARY_PATH")
    return {"LD_LIBRARY_PATH": f"{folder}{os.pathsep}{rest}" if rest else str(folder)}


# --- in the child, before the parse -----------------------------------------------------------------------------

_KEPT: dict[tuple[str, str], Any] = {}  # what was loaded, by (file, module): it outlives every engine of the process


def load(plugins: list[PluginLoad], module: str) -> None:
    """Each plugin loaded into this process (`module`: the TensorRT module that parses or runs here), in the declared
    order, once (a process that runs several engines registers its creators once); the first that fails raises its
    one-line PluginError."""
    for plugin in plugins:
        if (plugin.file, module) in _KEPT:
            continue
        try:
            _KEPT[plugin.file, module] = _import(plugin) if plugin.python else _load_library(plugin, module)
        except PluginError:
            raise
        except Exception as exc:  # noqa: BLE001 - the user's module failing at import, a library that will not load
            raise plugin.failed(f"{type(exc).__name__}: {first_line(exc)[:300]}") from None


def _import(plugin: PluginLoad) -> Any:
    assert plugin.python is not None
    if plugin.root and plugin.root not in sys.path:
        sys.path.append(plugin.root)  # appended, as the stage found it: never shadowing an installed package
    imported = importlib.import_module(plugin.python)
    got = getattr(imported, "__file__", None)
    if got is None or Path(got).resolve() != Path(plugin.file).resolve():
        raise plugin.failed(f"'{plugin.python}' was imported from {got}, not from {plugin.file}, whose source is in "
                            f"the stage's key")
    return imported


def _load_library(plugin: PluginLoad, module: str) -> Any:
    library = ctypes.CDLL(plugin.file)  # the loader's own error (a missing dependency) is the clearest
    if plugin.entry:
        entry = getattr(library, plugin.entry)
        entry.argtypes, entry.restype = [ctypes.c_void_p, ctypes.c_char_p], ctypes.c_bool
        if not entry(None, plugin.namespace.encode()):  # no logger: TensorRT's plugin libraries accept none
            raise plugin.failed(f"{plugin.entry}(logger, '{plugin.namespace}') returned false")
        return library
    trt = importlib.import_module(module)
    if trt.get_plugin_registry().load_library(plugin.file) is None:
        raise plugin.failed("TensorRT's plugin registry refused it (it exports no getCreators or getPluginCreators; "
                            "name the function that registers its creators as `entry`)")
    return library
