"""The asv dashboard in a real browser.

``asv publish`` builds the site from the committed results (asv_results/) into a temporary
directory, a local HTTP server serves it, and headless Chromium (Debian's ``chromium``,
driven by Playwright without a browser download) opens the benchmark grid and one
benchmark's graph. The tests check that the grid lists every benchmark and that the graph
draws points with the committed values, and save a screenshot of each page to
``$KAIONB_DASHBOARD_SCREENSHOTS`` (default: a pytest tmp directory).

asv's index.html loads jQuery, flot and Bootstrap from CDNs, which a machine without
network cannot reach: the browser gets them from Debian packages instead (CDN_COPIES).
Without Chromium, those packages or the ``dashboard`` extra the tests skip, unless
KAIONB_REQUIRE_BROWSER=1 (CI), where they fail.
"""

import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "asv_results"

# CDN prefix in asv 0.6's index.html -> (Debian package, the directory holding its files).
# jQuery 3.3.1, flot 0.8.3 and blueimp-md5 2.19.0 are the versions asv names; Debian has
# Bootstrap 3.4.1 for 3.1.1 and stupidtable 1.1.3 for 1.0.1 (regressions page only).
CDN_COPIES = {
    "https://code.jquery.com/": ("libghc-js-jquery-data", "/usr/share/haskell-js-jquery"),
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/":
        ("libghc-js-flot-data", "/usr/share/haskell-js-flot"),
    "https://cdn.jsdelivr.net/npm/bootstrap@3.1.1/dist/":
        ("libjs-bootstrap", "/usr/share/javascript/bootstrap"),
    "https://cdnjs.cloudflare.com/ajax/libs/stupidtable/1.0.1/":
        ("libjs-jquery-stupidtable", "/usr/share/javascript/jquery-stupidtable"),
    "https://cdnjs.cloudflare.com/ajax/libs/blueimp-md5/2.19.0/js/":
        ("node-blueimp-md5", "/usr/share/javascript/blueimp-md5"),
}
# flot-orderbars (bar order when a parameter is on the x axis) has no Debian package: an
# empty script lets the page load; the graph checked here has commits on the x axis.
EMPTY_SCRIPTS = {"https://cdn.jsdelivr.net/npm/flot-orderbars@1.0.0/js/jquery.flot.orderBars.js"}
CONTENT_TYPES = {".js": "text/javascript", ".css": "text/css", ".woff": "font/woff",
                 ".woff2": "font/woff2", ".ttf": "font/ttf", ".svg": "image/svg+xml"}

# The dashboard's headline graph; the first benchmark with results when they lack it.
GRAPH_BENCHMARK = "matmul.TimeMatmul.track_ratio_to_cublas"

# Without the flags after --disable-gpu Chromium's own connections (updates, sync, QUIC) are
# refused on a machine without network and it stalls. Playwright adds --headless and a
# fresh temporary --user-data-dir.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]

# flot keeps its plot object on the placeholder div. PLOTTED: the y value of every point the
# graph page's plot holds (null before there is a plot). DRAWN: how many pixels of its base
# canvas (the legend is HTML, not on it) have the colour of one of its series.
PLOTTED = """() => {
    const plot = $('#main-graph').data('plot');
    return plot ? plot.getData().flatMap(series => series.data.map(point => point[1])) : null;
}"""
DRAWN = """() => {
    const plot = $('#main-graph').data('plot');
    const colours = plot.getData().map(series => $.color.parse(series.color));
    const canvas = plot.getCanvas();
    const rgba = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
    let count = 0;
    for (let i = 0; i < rgba.length; i += 4) {
        if (rgba[i + 3] > 200 && colours.some(c => Math.abs(rgba[i] - c.r)
                + Math.abs(rgba[i + 1] - c.g) + Math.abs(rgba[i + 2] - c.b) < 30)) {
            count += 1;
        }
    }
    return count;
}"""


@pytest.fixture(scope="module", autouse=True)
def requirements():
    """Skip (fail with KAIONB_REQUIRE_BROWSER=1) without the browser and what it needs."""
    missing = [f"Debian package {package} ({path})"
               for package, path in CDN_COPIES.values() if not os.path.isdir(path)]
    if shutil.which("chromium") is None:
        missing.append("Debian package chromium")
    missing += [f"Python package {name} (pip install -e '.[dashboard]')"
                for name in ("asv", "playwright", "PIL") if importlib.util.find_spec(name) is None]
    if missing:
        message = "the dashboard test needs " + ", ".join(missing)
        if os.environ.get("KAIONB_REQUIRE_BROWSER") == "1":
            pytest.fail(message + " (KAIONB_REQUIRE_BROWSER=1)")
        pytest.skip(message)


@pytest.fixture(scope="module")
def benchmarks():
    """benchmarks.json of asv_results/: benchmark name -> its description."""
    path = RESULTS / "benchmarks.json"
    if not path.is_file():
        pytest.skip("asv_results/ holds no results (benchmarks/run_asv.sh writes them on the "
                    "GPU machine)")
    described = json.loads(path.read_text())
    del described["version"]
    return described


@pytest.fixture(scope="module")
def results(benchmarks):
    """Benchmark name -> the finite values the result files hold for it (maybe none)."""
    from asv.results import iter_results

    values = {}
    for result in iter_results(str(RESULTS)):
        for name in result.get_result_keys(benchmarks):
            found = result.get_result_value(name, benchmarks[name]["params"])
            values.setdefault(name, []).extend(
                v for v in found if v is not None and math.isfinite(v))
    if not values:
        pytest.skip("asv_results/ holds no result files")
    return values


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=shutil.which("chromium"),
                                              args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


@pytest.fixture(scope="module")
def site(results, tmp_path_factory):
    """The URL of the site ``asv publish`` built from asv_results/, served on 127.0.0.1."""
    html = tmp_path_factory.mktemp("asv_html")
    publish = subprocess.run(
        [sys.executable, "-m", "asv", "publish", "--no-pull", "--html-dir", str(html)],
        cwd=REPO, capture_output=True, text=True)
    assert publish.returncode == 0, f"asv publish failed:\n{publish.stdout}{publish.stderr}"
    # The substitutes in CDN_COPIES are not byte for byte the CDN's files, so the browser
    # would refuse them by their Subresource Integrity hashes.
    index = html / "index.html"
    index.write_text(re.sub(r'\s+integrity="[^"]*"', "", index.read_text()))
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_QuietHandler, directory=html))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/"
    server.shutdown()
    thread.join()
    server.server_close()


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory):
    kept = os.environ.get("KAIONB_DASHBOARD_SCREENSHOTS")
    if kept:
        Path(kept).mkdir(parents=True, exist_ok=True)
        return Path(kept)
    return tmp_path_factory.mktemp("dashboard_screenshots")


class _Page:
    """A browser page that gets CDN files from CDN_COPIES, refuses every other outside
    request, and records what it refused and the page's JavaScript errors."""

    def __init__(self, browser, site):
        self.site = site
        self.refused = []
        self.errors = []
        self.page = browser.new_page(viewport={"width": 1280, "height": 900})
        self.page.set_default_timeout(20_000)
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.route("**/*", self._route)

    def _route(self, route):
        url = route.request.url
        if url.startswith(self.site):
            return route.continue_()
        # index.html loads them with crossorigin="anonymous": the answer needs CORS.
        headers = {"Access-Control-Allow-Origin": "*"}
        if url in EMPTY_SCRIPTS:
            return route.fulfill(body="", content_type="text/javascript", headers=headers)
        for prefix, (_, directory) in CDN_COPIES.items():
            if url.startswith(prefix):
                local = Path(directory, url[len(prefix):].split("?")[0])
                if local.is_file():
                    return route.fulfill(path=local, headers=headers,
                                         content_type=CONTENT_TYPES.get(local.suffix))
        self.refused.append(url)
        return route.abort()

    def open(self, fragment):
        """Load the page at #fragment and wait until its scripts have fetched everything
        (asv draws a graph as soon as its data arrives)."""
        self.page.goto(self.site + fragment)
        self.page.wait_for_load_state("networkidle")
        assert not self.refused, f"the dashboard requested files with no copy here: {self.refused}"
        assert not self.errors, f"JavaScript errors on the dashboard: {self.errors}"

    def screenshot(self, path, **kwargs):
        self.page.screenshot(path=path, **kwargs)
        _check_png(path)


def _check_png(path):
    from PIL import Image

    with Image.open(path) as image:
        assert image.format == "PNG"
        assert image.width >= 800 and image.height >= 600, f"{path}: {image.size}"
        # getcolors(1) answers None when the image has more than one colour.
        assert image.convert("RGB").getcolors(1) is None, f"{path} is one uniform colour"


def _graph_benchmark(results):
    return GRAPH_BENCHMARK if GRAPH_BENCHMARK in results else min(results)


def test_grid_lists_every_benchmark(browser, site, benchmarks, results, screenshots):
    page = _Page(browser, site)
    page.open("")
    links = page.page.eval_on_selector_all(
        "#summarygrid-display a.benchmark-container",
        "links => links.map(link => [link.getAttribute('href'), link.innerText.trim()])")
    assert sorted(href for href, _ in links) == sorted(f"#{name}" for name in benchmarks)
    # Each tile is labelled with the name after its module: "TimeMatmul.track_tflops".
    assert all(href.endswith("." + text) for href, text in links), links
    # A tile draws its small graph once scrolled into view.
    name = _graph_benchmark(results)
    tile = page.page.locator(f"[id='summarygrid-{name}']")
    tile.scroll_into_view_if_needed()
    page.page.wait_for_function("tile => $(tile).data('plot')", arg=tile.element_handle())
    points = tile.evaluate("tile => $(tile).data('plot').getData()[0].data"
                           ".filter(point => point[1] !== null).length")
    assert points, f"the grid's tile of {name} plots no points"
    # Scrolled down, the fixed navigation bar would show mid-page in a full-page screenshot.
    page.page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(screenshots / "dashboard_grid.png", full_page=True)


def test_graph_draws_the_committed_values(browser, site, results, screenshots):
    name = _graph_benchmark(results)
    page = _Page(browser, site)
    page.open("#" + name)
    plotted = page.page.evaluate(PLOTTED)
    assert plotted is not None, f"the graph page of {name} has no plot"
    points = [v for v in plotted if v is not None]
    assert points, f"the graph of {name} plots no points"
    committed = results[name]
    strays = [v for v in points if not any(math.isclose(v, c, rel_tol=1e-9) for c in committed)]
    assert not strays, f"the graph of {name} plots values the results do not hold: {strays}"
    assert page.page.evaluate(DRAWN) > 0, f"the graph of {name} draws none of its points"
    page.screenshot(screenshots / "dashboard_graph.png")
