"""The README's quickstart, run as written: every line of every ```bash block between "## Quickstart" and the next
section, in order, by bash, in a project laid out as a new user's is (a model and a folder of its images: PP-OCR's
text-direction classifier and the example's lines), then the rebuild step once more after a driver upgrade.

What this machine lacks is stood in for, each stand-in named where it is made:
- the install line is what CI itself runs first (`.ci/run`): this test checks that it is the same command;
- `tritonserver` on PATH is the real Triton 2.51 from the nvidia-pytriton wheel (tests/triton_server.py), started by
  a wrapper that gives it what a machine without a GPU needs: the stand-in TensorRT backend (the shipped variant's
  ONNX on ONNX Runtime), KIND_CPU for KIND_GPU, and the port the test chose (the request example reads TRITON_URL);
- the GPU and its driver are a stand-in `nvidia-smi` (the documented CSV query and banner) whose driver version the
  test changes: it moves the environment fingerprint exactly as an upgrade would; no engine runs either way;
- `python` and `trtflow` are the interpreter running the tests, with its packages, as they are after the install:
  in a virtual environment that interpreter is the environment's (a script that execs it by its path; a symlink to
  it outside the environment would start the base interpreter, which has none of the environment's packages).

The Triton server it starts is stopped with everything it started (tests/triton_server.py `stop`), pass or fail.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests import triton_server
from tests.assets import EXAMPLES, last_report

ROOT = Path(__file__).resolve().parent.parent
MODEL = EXAMPLES / "ppocr-cls" / "models" / "ch_ppocr_mobile_v2.0_cls_infer.onnx"
OLD_DRIVER, NEW_DRIVER = "550.54.15", "560.35.03"


def quickstart_blocks(readme: str) -> list[list[str]]:
    """The quickstart's ```bash blocks, each as its command lines."""
    start = readme.index("## Quickstart")
    end = readme.index("\n## ", start + 1)
    blocks = re.findall(r"```bash\n(.*?)```", readme[start:end], flags=re.S)
    return [[ln.strip() for ln in b.splitlines() if ln.strip() and not ln.strip().startswith("#")] for b in blocks]


def _smi(bin_dir: Path, driver: str) -> None:
    (bin_dir / "smi.csv").write_text(f"NVIDIA RTX A4000, 8.6, {driver}, 16376\n")
    (bin_dir / "smi.txt").write_text(
        "+-----------------------------------------------------------------------------------------+\n"
        f"| NVIDIA-SMI {driver}              Driver Version: {driver}      CUDA Version: 12.4     |\n")


def _stand_ins(bin_dir: Path, store: Path, log: Path) -> None:
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\nif [ -n "$1" ]; then cat {shlex.quote(str(bin_dir / "smi.csv"))}; '
                   f'else cat {shlex.quote(str(bin_dir / "smi.txt"))}; fi\n')
    _smi(bin_dir, OLD_DRIVER)
    python_shim(bin_dir / "python")
    (bin_dir / "trtflow").write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m trtflow.flows.cli \"$@\"\n")
    server = bin_dir / "tritonserver"
    server.write_text(f"#!{sys.executable}\n" + textwrap.dedent(f"""\
        # stand-in wrapper: the real tritonserver, given what a machine without a GPU needs (tests/test_quickstart.py)
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from tests.test_quickstart import serve
        serve(sys.argv[1:], {str(store)!r}, {str(log)!r})
        """))
    for exe in (smi, bin_dir / "trtflow", server):
        exe.chmod(0o755)


def python_shim(path: Path, interpreter: str = sys.executable) -> None:
    """`python` as the installed user's shell finds it: `interpreter` with its own packages. A script that execs it
    by its own path, not a symlink: Python finds a virtual environment by the `pyvenv.cfg` beside (or above) the path
    it was started by, and a symlink to a venv's `python` placed elsewhere starts the base interpreter."""
    path.write_text(f'#!/bin/sh\nexec {shlex.quote(interpreter)} "$@"\n')
    path.chmod(0o755)


def test_the_python_shim_runs_each_interpreter_with_its_own_packages(tmp_path):
    """In a virtual environment and in a base interpreter alike, the quickstart's `python` is that interpreter with its
    own prefix (where its packages are): the test's own, a fresh venv made from it, and the base one."""
    made = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(made)], check=True, timeout=120)
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    cases = {sys.executable: sys.prefix, str(made / "bin" / "python"): str(made)}
    if base.is_file():
        cases[str(base)] = sys.base_prefix
    for i, (interpreter, prefix) in enumerate(cases.items()):
        shim = tmp_path / f"bin{i}" / "python"
        shim.parent.mkdir()
        python_shim(shim, interpreter)
        done = subprocess.run(["bash", "-c", "python -c 'import sys; print(sys.prefix)'"], capture_output=True,
                              text=True, timeout=60, env={**os.environ, "PATH": f"{shim.parent}{os.pathsep}"
                                                          f"{os.environ['PATH']}"}, check=False)
        assert done.returncode == 0, done.stderr
        assert Path(done.stdout.strip()).resolve() == Path(prefix).resolve(), (interpreter, done.stdout, prefix)


def serve(argv: list[str], store: str, log: str) -> None:
    """`tritonserver --model-repository R`: R's release copied as a machine without a GPU must have it, then the real
    server exec'd in this process (it stays in the shell's process group, which the test stops)."""
    from trtflow.stages.release.triton.preprocess import REQUIREMENTS
    given = Path(argv[argv.index("--model-repository") + 1])
    repo = Path(log).parent / "served"
    repo.mkdir(exist_ok=True)
    report, _ = triton_server.released(Path(store), repo)
    assert given.resolve().parent.parent / "triton" / report["target"] == given.resolve(), (given, report)
    env = triton_server.environment(list(REQUIREMENTS) + triton_server.STAND_IN_REQUIREMENTS)
    home = triton_server.server_home()
    host, port = os.environ["TRITON_URL"].split(":")
    grpc, metrics = triton_server._free_ports(2)
    variables = triton_server.server_environment(env)
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)  # a file, not a pipe: a full pipe stops it
    os.dup2(out, 1)
    os.dup2(out, 2)
    binary = str(home / "pytriton" / "tritonserver" / "bin" / "tritonserver")
    os.execve(binary, [binary, "--model-repository", str(repo), "--backend-directory",
                       str(triton_server.backends(home)), "--http-address", host, "--http-port", port,
                       "--grpc-address", host, "--grpc-port", str(grpc), "--metrics-port", str(metrics),
                       "--allow-metrics", "false"], variables)


@pytest.mark.slow
def test_the_readme_quickstart_runs_as_written(tmp_path):
    blocks = quickstart_blocks((ROOT / "README.md").read_text())
    # install, init, run, card, serve, rebuild: each block is unpacked below into exactly its lines, so a command
    # added to the quickstart fails this test until it runs it too
    assert len(blocks) == 6, blocks

    # 1. the install: CI runs exactly this first, on a fresh machine
    install = blocks[0]
    assert install == ['pip install -e ".[rtx,torch,test]"'], install
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip install -q -e ".[rtx,torch,test]"' in ci, "CI no longer installs as the README says"

    project = tmp_path / "model"
    (project / "data").mkdir(parents=True)
    shutil.copy(MODEL, project / "model.onnx")
    for image in sorted((EXAMPLES / "ppocr-cls" / "data").glob("*.png")):
        shutil.copy(image, project / "data" / image.name)
    bin_dir, log = tmp_path / "bin", tmp_path / "tritonserver.log"
    _stand_ins(bin_dir, project / ".trtflow", log)
    http_port, = triton_server._free_ports(1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_") or k == "PREFECT_API_URL"}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", PREFECT_HOME=str(tmp_path / "prefect"), COLUMNS="200",
               TRTFLOW_STATE_DIR=str(tmp_path / "state"), TRITON_URL=f"127.0.0.1:{http_port}")

    def run(command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", command], cwd=project, env=env, capture_output=True, text=True,
                              timeout=900)

    # the README's `python` is the interpreter the install put trtflow in: this one, with its packages (a venv's)
    done = run("python -c 'import sys; print(sys.prefix)'")
    assert Path(done.stdout.strip()).resolve() == Path(sys.prefix).resolve(), done.stdout + done.stderr

    # 2. init writes the pipeline beside the model
    init, = blocks[1]
    done = run(init)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (project / "pipeline.yaml").is_file() and "wrote pipeline.yaml" in done.stdout

    # 3. run it to a release
    first, = blocks[2]
    done = run(first)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "done 8 stages (8 ran, 0 reused)" in done.stdout, done.stdout
    assert "ran release (release)" in done.stdout
    # the conventional preprocessing init writes agrees with the torchvision reference it writes beside it
    assert last_report(project / ".trtflow", "parity")["verdict"] == "pass"
    assert last_report(project / ".trtflow", "int8")["data"].startswith("images via preprocess")

    # 4. the card
    card, = blocks[3]
    done = run(card)
    assert done.returncode == 0, done.stderr
    folder = Path(done.stdout.strip())
    assert (folder / "model-card.html").is_file() and "**Shipped**" in (folder / "model-card.md").read_text()

    # 5. served by the real Triton (stand-in wrapper), answered by the card's own request example
    serve_line, request = blocks[4]
    assert serve_line.endswith("&")
    server = triton_server.watch(subprocess.Popen(
        ["bash", "-c", serve_line.removesuffix("&").strip()], cwd=project, env=env, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    try:
        done = subprocess.run(["bash", "-c", request], cwd=project, env={**env, "WAIT": "180"},
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr + (log.read_text()[-3000:] if log.exists() else "")
        # the classifier's one output, at the first profile's opt batch
        assert re.fullmatch(r"\S+ \(\d+, 2\)", done.stdout.strip()), done.stdout
    finally:  # the shell, the server and its Python backend's stubs: none is left, whatever the outcome
        triton_server.stop(server)
    assert not triton_server.stubs(log.parent / "served"), triton_server.stubs(log.parent / "served")  # serve()'s

    # 6. the rebuild step: first on an unchanged machine (its first record; nothing to do), then after the driver
    # changed (the stand-in nvidia-smi now reports the new version)
    check, rerun = blocks[5]
    done = run(check)
    assert done.returncode == 0 and "recorded this machine's environment" in done.stdout, done.stdout + done.stderr
    done = run(rerun)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "(0 ran, 8 reused)" in done.stdout, done.stdout
    _smi(bin_dir, NEW_DRIVER)
    done = run(check)
    assert done.returncode == 3, done.stdout + done.stderr
    assert OLD_DRIVER in done.stdout and NEW_DRIVER in done.stdout, done.stdout
    done = run(rerun)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "reused prepare" in done.stdout and "ran build (build)" in done.stdout, done.stdout
    assert "environment changed" in done.stdout and NEW_DRIVER in done.stdout, done.stdout
    assert re.search(r"\(4 ran, 4 reused\)", done.stdout), done.stdout
    assert run(check).returncode == 0  # recorded: the machine is up to date with it
