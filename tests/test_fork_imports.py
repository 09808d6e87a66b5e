"""Stage processes start with the modules of the stages about to run already imported (flows/isolate.py `warm_up`,
flows/fork_imports.py; issue #54), and only those: a run's own stages decide, a module that fails to import leaves
the fork server serving, and the list reaches no process's environment."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PROBE = """
import json, os, sys
from trtflow.flows import isolate

def seen():
    return {"tabnanny": "tabnanny" in sys.modules, "mailbox": "mailbox" in sys.modules,
            "variable": isolate.FORK_SERVER_IMPORTS in os.environ}

if __name__ == "__main__":
    from probe_module import seen
    isolate.warm_up(sys.argv[1:])
    caller = isolate.FORK_SERVER_IMPORTS in os.environ
    print(json.dumps({**isolate.call_stage(seen, (), 60, "probe"), "caller": caller}))
"""


def _stage_sees(tmp_path: Path, *imports: str) -> dict:
    (tmp_path / "probe_module.py").write_text(PROBE)
    (tmp_path / "raises_at_import.py").write_text("raise RuntimeError('a library broken at import')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    env.pop("TRTFLOW_IN_PROCESS", None)
    done = subprocess.run([sys.executable, str(tmp_path / "probe_module.py"), *imports], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_stage_process_starts_with_what_warm_up_named_and_nothing_else(tmp_path):
    seen = _stage_sees(tmp_path, "raises_at_import", "no_such_module_here", "tabnanny")
    assert seen == {"tabnanny": True, "mailbox": False, "variable": False, "caller": False}
    assert _stage_sees(tmp_path) == {"tabnanny": False, "mailbox": False, "variable": False, "caller": False}


@pytest.mark.slow
def test_a_run_preloads_the_kinds_of_the_stages_it_will_run(workdir):
    """Cold: every stage's kind. After a change to the last stage only: that stage's kind alone."""
    from tests.test_runner import run_all
    from trtflow.flows.runner import make_runner

    path = workdir / "pipeline.yaml"
    path.write_text(textwrap.dedent("""
        version: 1
        name: preloads
        model: models/cls.onnx
        stages:
          prepare: {kind: prepare, simplify: false, preflight: "off"}
          fp16: {kind: precision, to: fp16, preflight: "off"}
    """))
    runner = make_runner(str(path), ["artifacts=store"], None)
    assert runner.reuse_all(None, None) is None
    assert runner.pending == ["prepare", "fp16"]
    assert runner.imports(runner.pending)[:2] == ["trtflow.stages.prepare.stage", "onnxsim"]
    assert "trtflow.stages.precision.stage" in runner.imports(runner.pending)

    assert run_all(path, ["artifacts=store"]) == {"prepare": "ran", "fp16": "ran"}
    runner = make_runner(str(path), ["artifacts=store", "stages.fp16.holdout=1"], None)
    assert runner.reuse_all(None, None) is None
    assert runner.pending == ["fp16"]
    assert "trtflow.stages.prepare.stage" not in runner.imports(runner.pending)
    runner = make_runner(str(path), ["artifacts=store"], None)
    assert runner.reuse_all(None, None) is not None and runner.pending == []
