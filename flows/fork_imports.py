"""Imported by the fork server as it starts (flows/isolate.py): the modules the stages about to run will import,
named in the fork server's environment, so that each stage process starts with them loaded instead
of importing them again. A module that fails to import here is left for the stage that needs it to fail on, in
its own words. PyTorch stays hidden as where trtflow imports these libraries itself (trtflow/no_torch.py), and
plots go to files (stages/compare/plots.py selects the same backend)."""
from __future__ import annotations

import importlib
import os

from trtflow.flows.isolate import FORK_SERVER_IMPORTS
from trtflow.no_torch import torch_hidden


def _import_all(names: str) -> None:
    if not names:
        return
    os.environ.setdefault("MPLBACKEND", "Agg")  # this process's own: a stage process's environment is replaced
    with torch_hidden():
        for name in filter(None, names.split(",")):
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001, S112 - the stage that imports it says what is wrong
                continue


_import_all(os.environ.get(FORK_SERVER_IMPORTS, ""))
