"""A pipeline run's name and tags in Prefect, from its file (the flow run's, and the no-op record's)."""
from __future__ import annotations

import hashlib
from pathlib import Path

from trtflow.errors import SpecError
from trtflow.pipelines.loader import parse_yaml


def run_identity(pipeline_file: str) -> tuple[str, list[str]]:
    """(flow run name, tags) for a pipeline file: `<name>@<repo>-<6 hex of the file's content>`; the repo is the
    directory holding the pipeline file."""
    path = Path(pipeline_file).resolve()
    try:  # the loader's own parser: it refuses alias bombs before anything expands them
        text = path.read_bytes()
        data, _ = parse_yaml(text.decode("utf-8"), str(path))
        name = str(data.get("name") or path.stem)
    except (OSError, UnicodeDecodeError, SpecError, AttributeError):
        return path.name, ["trtflow"]
    repo = path.parent.name or "root"
    short = hashlib.sha256(text).hexdigest()[:6]
    return f"{name}@{repo}-{short}", ["trtflow", f"pipeline:{name}", f"repo:{repo}"]
