"""Opening the store a location names: a directory (flows/store.py) or an fsspec URL (flows/remote_store.py).
Here, not in either, so that neither imports the other's module for it."""
from __future__ import annotations

from pathlib import Path

from trtflow.flows.remote_store import RemoteStore
from trtflow.flows.store import ArtifactStore, LocalStore
from trtflow.pipelines.loader import is_url


def open_store(location: str | Path) -> ArtifactStore:
    return RemoteStore(str(location)) if is_url(location) else LocalStore(Path(location))
