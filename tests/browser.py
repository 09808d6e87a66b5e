"""A page opened as a person opens it: headless Chromium (Debian's, /usr/bin/chromium: README, Set up) driven by
Playwright. Skips without Chromium on a developer's machine; fails in CI, which installs it."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.assets import in_ci

# as this machine's notes say Chromium must start here: no sandbox as root, and no background connections to a
# network that refuses them
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]

READ = """() => ({
  title: document.title,
  images: [...document.images].map(i => ({alt: i.alt, loaded: i.complete && i.naturalWidth > 0,
                                          width: i.naturalWidth})),
  values: [...document.querySelectorAll('[data-value]')].map(e => ({
    engine: e.closest('tr')?.dataset.engine ?? null, field: e.dataset.field, metric: e.dataset.metric ?? null,
    value: Number(e.dataset.value), shown: e.textContent.trim(), visible: e.getClientRects().length > 0})),
  fields: Object.fromEntries([...document.querySelectorAll('[data-field]:not([data-value])')]
                             .map(e => [e.dataset.field, e.textContent.trim()])),
  keys: Object.fromEntries([...document.querySelectorAll('tr[data-stage]')]
                           .map(r => [r.dataset.stage, r.querySelector('[data-field=key]').textContent.trim()])),
  text: document.body.innerText,
})"""


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        message = "needs Chromium (apt-get install chromium)"
        if in_ci():
            pytest.fail(f"{message}: CI installs it as the README says", pytrace=False)
        pytest.skip(message)
    return found


def open_page(page: Path, screenshot: Path) -> dict[str, Any]:
    """What the page shows once rendered (its images decoded, every number carrying a data-value), with a
    full-page screenshot saved to `screenshot`."""
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=FLAGS)
        try:
            tab = browser.new_page(viewport={"width": 1200, "height": 900})
            tab.goto(page.resolve().as_uri(), wait_until="load")
            seen = tab.evaluate(READ)
            tab.screenshot(path=str(screenshot), full_page=True)
        finally:
            browser.close()
    return seen
