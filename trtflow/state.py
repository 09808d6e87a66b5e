"""Where trtflow keeps what belongs to this machine and user, outside any store: the environment record
`check-env` compares with, the background Prefect server's record, the TensorRT version probe's cache."""
from __future__ import annotations

import os
from pathlib import Path

from trtflow import settings


def state_dir() -> Path:
    """`$TRTFLOW_STATE_DIR`, else `$XDG_STATE_HOME/trtflow` (`~/.local/state/trtflow`)."""
    if chosen := settings.STATE_DIR.get():
        return chosen
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "trtflow"
