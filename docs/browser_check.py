"""Open the built site in headless Chromium, as a reader with no network would, and screenshot each top-level page.

    pip install -e ".[docs]"              # mkdocs and friends, and playwright (the driver, no browser)
    apt-get install chromium              # Debian's Chromium: /usr/bin/chromium
    mkdocs build --strict -d site
    python docs/browser_check.py site shots/

For each page of mkdocs.yml's nav this serves the site on localhost, loads the page with every request off
the host refused, waits for it to render, saves ``shots/<page>.png`` (the first screen, 1280 x 900) and
records what the browser reported: console errors, uncaught exceptions, failed requests, and whether the
page's maths rendered (a MathML element with a non-zero size). It prints one line per page and exits 1 if
any page had a console error, an exception or a failed request, or if a page's formula drew as nothing.
"""

from __future__ import annotations

import functools
import http.server
import pathlib
import sys
import threading

import yaml
from playwright.sync_api import sync_playwright

CHROMIUM = "/usr/bin/chromium"
#: As the probe of this machine starts it: no background traffic to Google's hosts, which the network refuses.
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


def nav_pages(config: pathlib.Path) -> list[str]:
    """The nav's pages, as paths under the site (``guide/``); the API reference's pages included."""
    def walk(entry):
        if isinstance(entry, str):
            yield entry
        elif isinstance(entry, dict):
            for value in entry.values():
                yield from walk(value)
        else:
            for item in entry:
                yield from walk(item)

    nav = yaml.load(config.read_text(), Loader=yaml.BaseLoader)["nav"]
    return ["" if p == "index.md" else p.removesuffix(".md").removesuffix("index") + "/" for p in walk(nav)]


def check(site: pathlib.Path, shots: pathlib.Path, config: pathlib.Path) -> int:
    handler = functools.partial(_Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    shots.mkdir(parents=True, exist_ok=True)
    failures = 0
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        for path in nav_pages(config):
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(base)
                       else route.abort())
            problems: list[str] = []
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(f"exception: {e}"))
            page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
            page.goto(base + path, wait_until="networkidle")
            maths = page.eval_on_selector_all(
                "math", "els => els.map(e => e.getBoundingClientRect()).map(r => r.width * r.height)")
            if any(area == 0 for area in maths):
                problems.append(f"{sum(a == 0 for a in maths)} of {len(maths)} formulas drew as nothing")
            name = path.strip("/").replace("/", "_") or "index"
            page.screenshot(path=str(shots / f"{name}.png"))
            failures += bool(problems)
            print(f"{'FAIL' if problems else 'ok  '} /{path}  ({len(maths)} formulas)" +
                  "".join(f"\n      {p}" for p in problems))
            page.close()
        browser.close()
    server.shutdown()
    return 1 if failures else 0


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    root = pathlib.Path(__file__).resolve().parents[1]
    sys.exit(check(pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), root / "mkdocs.yml"))
