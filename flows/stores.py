"""Which store a location names: a directory or an fsspec URL."""
from __future__ import annotations

from pathlib import Path

from trtflow.flows.store import ArtifactStore, LocalStore


def open_store(location: str | Path) -> ArtifactStore:
    """The store a location names: a directory (`LocalStore`) or an fsspec URL (`RemoteStore`, which builds on
    `store.py`: imported only then)."""
    from trtflow.pipelines.loader import is_url

    if is_url(location):
        from trtflow.flows.remote_store import RemoteStore

        return RemoteStore(str(location))
    return LocalStore(Path(location))
