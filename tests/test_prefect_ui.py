"""The Prefect UI of trtflow's background server shows the run trtflow printed: opened as a person opens it (headless
Chromium, tests/browser.py) at the address `trtflow run` printed, on the real background server with its UI. The
page must reach its own API (the server is started with PREFECT_UI_API_URL), draw the run's stages, list each
stage's summary and plot artifacts, and render both."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import httpx
import pytest

from tests.browser import FLAGS, chromium

CLI = [sys.executable, "-m", "trtflow.flows.cli"]
PIPELINE = """version: 1
name: seen
model: models/cls.onnx
stages:
  prepare: {kind: prepare, preflight: off, input_shapes: {x: [1, 3, 48, 192]}}
  plot: {kind: "tests.stage_fns:plot", outputs: {plot: file}}
"""


def _text_within(tab, wanted: list[str], seconds: float = 60) -> str:
    """The page's text once it shows every string in `wanted` (the UI fills in from its API after load)."""
    deadline = time.monotonic() + seconds
    while True:
        text = tab.evaluate("document.body.innerText")
        if all(w in text for w in wanted) or time.monotonic() > deadline:
            return text
        time.sleep(0.5)


@pytest.mark.slow
def test_the_background_servers_ui_shows_the_flow_run_trtflow_printed(workdir, tmp_path):
    playwright = pytest.importorskip("playwright.sync_api")
    browser_path = chromium()
    (workdir / "pipeline.yaml").write_text(PIPELINE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_") and k != "TRTFLOW_PREFECT_SERVER"}
    env.update({"PREFECT_HOME": str(tmp_path / "prefect-home"), "TRTFLOW_STATE_DIR": str(tmp_path / "state"),
                "PYTHONPATH": os.pathsep.join(sys.path)})

    def trtflow(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(CLI + list(args), env=env, cwd=workdir, capture_output=True, text=True, timeout=300)
    try:
        done = trtflow("run", "pipeline.yaml")
        assert done.returncode == 0, done.stdout + done.stderr
        printed = re.search(r"flow run: (http://127\.0\.0\.1:\d+/flow-runs/flow-run/[0-9a-f-]{36})", done.stdout)
        assert printed, done.stdout
        page = printed.group(1)
        base = page.split("/flow-runs/")[0]
        artifacts = {a["key"]: a for a in httpx.post(f"{base}/api/artifacts/filter", json={}, timeout=30).json()
                     if a["key"]}
        summary = next(a for k, a in artifacts.items() if k.endswith("-prepare") and a["type"] == "markdown")
        plot = next(a for a in artifacts.values() if a["type"] == "image")

        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=browser_path, args=FLAGS)
            try:
                tab = browser.new_page(viewport={"width": 1400, "height": 1000})
                tab.goto(page, wait_until="load")
                seen = _text_within(tab, ["Completed", "prepare", "plot"])
                assert "Can't connect to Server API" not in seen and "Completed" in seen, seen[:2000]
                assert "prepare" in seen and "plot" in seen, "the run's stages"
                tab.get_by_text("Artifacts", exact=True).first.click()
                listed = _text_within(tab, [summary["key"], plot["key"]])
                assert summary["key"] in listed and plot["key"] in listed and "IMAGE" in listed, listed[-1500:]
                tab.screenshot(path=str(tmp_path / "flow-run.png"), full_page=True)

                tab.goto(f"{base}/artifacts/artifact/{summary['id']}", wait_until="load")
                shown = _text_within(tab, ["ran · stage prepare"])
                assert "ran · stage prepare" in shown and "published in" in shown, shown[:2000]

                tab.goto(f"{base}/artifacts/artifact/{plot['id']}", wait_until="load")
                _text_within(tab, ["plots/errors.png"])
                tab.wait_for_function("[...document.images].some(i => i.src.startsWith('data:image/png') "
                                      "&& i.complete && i.naturalWidth > 100)", timeout=60_000)
            finally:
                browser.close()
    finally:
        trtflow("server", "stop")
