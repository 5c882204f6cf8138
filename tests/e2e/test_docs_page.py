"""`/docs` rendered by a real browser (Debian's headless Chromium) against a real gateway and worker:
Swagger UI reads the OpenAPI 3.1 document and lists the routes. Before, the bundled Swagger UI
(4.15.5, which reads OpenAPI 3.0 at most) showed "Unable to render this definition", while the
tests only checked that its files were served."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

# Debian's chromium-headless-shell (`make browser-tools` installs it), or a full chromium
BROWSERS = ("chromium-headless-shell", "chromium")


def browser() -> str:
    for name in BROWSERS:
        found = shutil.which(name)
        if found is not None:
            return found
    pytest.fail("no headless Chromium on PATH: `make browser-tools` installs Debian's one")


def rendered(url: str, profile: Path) -> str:
    """The page's DOM once its scripts ran and settled: virtual time lets Swagger UI fetch the
    document and render it before the DOM is dumped (no sleeps, no network beyond `url`'s host)."""
    done = subprocess.run(
        [
            browser(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={profile}", "--virtual-time-budget=20000", "--dump-dom", url,
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_the_docs_page_renders_every_route_of_the_document(stack, tmp_path):
    import httpx

    dom = rendered(f"{stack.url}/docs", tmp_path / "profile")
    assert "Unable to render this definition" not in dom
    shown = set(re.findall(r'data-path="([^"]+)"', dom))
    documented = set(httpx.get(f"{stack.url}/openapi.json", timeout=30).json()["paths"])
    assert "/v1/embeddings" in shown and shown == documented
    assert "kembed gateway" in dom  # the document's title, as Swagger UI shows it
