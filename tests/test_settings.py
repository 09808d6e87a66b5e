"""trtflow's environment variables are checked: a bad value is one line naming the variable, its value (escaped) and
what it takes, exit 2, before anything starts. `TRTFLOW_SERVER_PATIENCE=-1` used to become 3 s and `nan` or `abc`
300 s, `TRTFLOW_IN_PROCESS=true` was silently off, `TRTFLOW_PREFECT_SERVER=ephemral` silently the background
server, and a relative `TRTFLOW_STATE_DIR` a different state (and server record) per working directory."""
from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.processes import PIPE
from tests.test_cli import one_error_line, run_cli
from tests.test_server import _isolated, _kill_recorded
from trtflow import settings

BAD = [
    ("TRTFLOW_SERVER_PATIENCE", "-1"),
    ("TRTFLOW_SERVER_PATIENCE", "0"),
    ("TRTFLOW_SERVER_PATIENCE", "2"),  # below one health check (every 3 s)
    ("TRTFLOW_SERVER_PATIENCE", "1e9"),
    ("TRTFLOW_SERVER_PATIENCE", "nan"),
    ("TRTFLOW_SERVER_PATIENCE", "inf"),
    ("TRTFLOW_SERVER_PATIENCE", "abc"),
    ("TRTFLOW_SERVER_PATIENCE", ""),
    ("TRTFLOW_PREFECT_SERVER", "ephemral"),
    ("TRTFLOW_PREFECT_SERVER", ""),
    ("TRTFLOW_IN_PROCESS", "true"),
    ("TRTFLOW_IN_PROCESS", "2"),
    ("TRTFLOW_IN_PROCESS", ""),
    ("TRTFLOW_MACHINE", "rig 3"),
    ("TRTFLOW_MACHINE", "rig\n3\x1b[2J"),  # control characters: shown escaped, still one line
    ("TRTFLOW_MACHINE", ""),
    ("TRTFLOW_GPU_KIND", "a100/80"),
    ("TRTFLOW_GPU_KIND", "-a100"),
    ("TRTFLOW_STATE_DIR", "state"),
    ("TRTFLOW_STATE_DIR", "~/state"),
    ("TRTFLOW_STATE_DIR", ""),
    ("TRTFLOW_CACHE_DIR", "./cache"),
    ("TRTFLOW_CACHE_DIR", "/cache\r"),
    ("TRTFLOW_STORE_CREDENTIALS", "secret/"),
    ("TRTFLOW_STORE_CREDENTIALS", "vault/fleet"),
    ("TRTFLOW_STORE_CREDENTIALS", "secret/fleet s3"),
    ("TRTFLOW_STORE_CREDENTIALS", ""),
    ("TRTFLOW_SERVER_DATABASE", "postgres"),
    ("TRTFLOW_SERVER_DATABASE", "postgresql://prefect@db/prefect"),  # not Prefect's async driver
    ("TRTFLOW_SERVER_DATABASE", "postgresql+asyncpg://p@db/x\nrm"),
    ("TRTFLOW_POSTGRES_BIN", "pg/bin"),
]


@pytest.mark.parametrize(("name", "value"), BAD, ids=[f"{n}={v!r}" for n, v in BAD])
def test_a_bad_value_is_one_line_naming_the_variable_before_anything_starts(capsys, monkeypatch, workdir, name,
                                                                             value):
    (workdir / "pipeline.yaml").write_text(PIPE.format(name="env"))
    monkeypatch.chdir(workdir)
    monkeypatch.setenv(name, value)
    started = time.monotonic()
    code, out, err = run_cli(capsys, "run", "pipeline.yaml")
    line = one_error_line(err)
    assert code == 2 and not out.strip(), (code, out)
    shown = "" if name == "TRTFLOW_SERVER_DATABASE" else f"={value!r}"  # a URL's value never: it may hold a password
    assert f"{name}{shown} is not " in line and f"unset {name} for " in line, line
    assert not any(ord(c) < 32 for c in line), "a control character of the value reached the terminal"
    assert not (workdir / ".trtflow").exists(), "nothing ran: the store was not even created"
    assert time.monotonic() - started < 5


def test_server_patience_abc_stops_trtflow_run_before_it_starts_a_server(workdir, tmp_path):
    """The real CLI in its own process, with the background server it would otherwise start first."""
    (workdir / "pipeline.yaml").write_text(PIPE.format(name="env"))
    env = {**_isolated(tmp_path), "TRTFLOW_SERVER_PATIENCE": "abc"}
    record = tmp_path / "state" / "prefect-server.json"
    try:
        done = subprocess.run([sys.executable, "-m", "trtflow.flows.cli", "run", "pipeline.yaml"], env=env,
                              cwd=workdir, capture_output=True, text=True, timeout=300)
        assert done.returncode == 2 and not done.stdout.strip(), done
        assert done.stderr.strip() == ("error: environment variable TRTFLOW_SERVER_PATIENCE='abc' is not a number of "
                                       "seconds from 3 to 86400 (default 300) (correct it, or unset "
                                       "TRTFLOW_SERVER_PATIENCE for the default)"), done.stderr
        assert not record.exists(), "no background Prefect server was started"
        assert not (workdir / ".trtflow").exists()
    finally:
        _kill_recorded(record)


def test_good_values_are_read_as_typed_values(monkeypatch, tmp_path):
    for name in (s.name for s in settings.ALL):
        monkeypatch.delenv(name, raising=False)
    assert settings.SERVER_PATIENCE.get() == 300.0 and settings.PREFECT_SERVER.get() == "background"
    assert settings.IN_PROCESS.get() is False and settings.MACHINE.get() is None
    assert settings.STATE_DIR.get() is None and settings.STORE_CREDENTIALS.get() is None
    assert settings.SERVER_DATABASE.get() == "sqlite" and settings.POSTGRES_BIN.get() is None
    good = {"TRTFLOW_SERVER_PATIENCE": "3", "TRTFLOW_PREFECT_SERVER": "ephemeral", "TRTFLOW_IN_PROCESS": "1",
            "TRTFLOW_MACHINE": "rig-3.lab_a", "TRTFLOW_GPU_KIND": "a100", "TRTFLOW_STATE_DIR": str(tmp_path / "s"),
            "TRTFLOW_CACHE_DIR": str(tmp_path / "c"), "TRTFLOW_STORE_CREDENTIALS": "aws-credentials/fleet-s3",
            "TRTFLOW_SERVER_DATABASE": "postgresql+asyncpg://prefect:pw@db:5432/prefect",
            "TRTFLOW_POSTGRES_BIN": str(tmp_path / "pg")}
    for name, value in good.items():
        monkeypatch.setenv(name, value)
    settings.check_all()
    assert settings.SERVER_PATIENCE.get() == 3.0 and settings.PREFECT_SERVER.get() == "ephemeral"
    assert settings.IN_PROCESS.get() is True and settings.MACHINE.get() == "rig-3.lab_a"
    assert settings.GPU_KIND.get() == "a100" and settings.STATE_DIR.get() == tmp_path / "s"
    assert settings.CACHE_DIR.get() == tmp_path / "c"
    assert settings.STORE_CREDENTIALS.get() == ("aws-credentials", "fleet-s3")
    assert settings.SERVER_DATABASE.get() == "postgresql+asyncpg://prefect:pw@db:5432/prefect"
    assert settings.POSTGRES_BIN.get() == tmp_path / "pg"
    monkeypatch.setenv("TRTFLOW_SERVER_PATIENCE", "86400")
    monkeypatch.setenv("TRTFLOW_IN_PROCESS", "0")
    assert settings.SERVER_PATIENCE.get() == 86400.0 and settings.IN_PROCESS.get() is False


def test_good_values_let_a_command_run(capsys, monkeypatch, workdir, tmp_path):
    """Where trtflow reads them: the machine's name and GPU kind, its state directory."""
    from trtflow.flows import machine
    from trtflow.state import state_dir

    (workdir / "pipeline.yaml").write_text(PIPE.format(name="env"))
    monkeypatch.chdir(workdir)
    for name, value in {"TRTFLOW_SERVER_PATIENCE": "600", "TRTFLOW_MACHINE": "rig-3", "TRTFLOW_GPU_KIND": "a100",
                        "TRTFLOW_STATE_DIR": str(tmp_path / "here"), "TRTFLOW_IN_PROCESS": "0"}.items():
        monkeypatch.setenv(name, value)
    code, out, err = run_cli(capsys, "validate", "pipeline.yaml")
    assert code == 0 and not err.strip(), err
    assert machine.machine_name() == "rig-3" and state_dir() == tmp_path / "here"
    code, out, err = run_cli(capsys, "init-deploy", "-o", str(tmp_path / "deploy.yaml"))
    assert code == 0 and "for machine rig-3 (GPU kind a100)" in out, out + err


def test_docs_list_every_variable_with_what_it_takes():
    """docs/prefect.md (Environment variables): every variable trtflow reads, with the accepted values its error
    names."""
    text = Path(__file__).parent.parent.joinpath("docs", "prefect.md").read_text()
    section = text.split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    rows = {m.group(1): m.group(2).replace("`", "")
            for m in re.finditer(r"^\| `(TRTFLOW_[A-Z_]+)` \| ([^|]+) \|", section, re.MULTILINE)}
    for setting in settings.ALL:
        assert setting.name in rows, setting.name
        assert setting.accepts in rows[setting.name], (setting.name, setting.accepts, rows[setting.name])
    # and two trtflow does not read: one for `prefect deploy`, one it sets in each stage's process
    assert set(rows) == {*(s.name for s in settings.ALL), "TRTFLOW_MODELS", "TRTFLOW_STAGE_TAG"}
