"""Headless Chromium for the tests of pages people look at (the HTML report, flame graphs).

Debian's `chromium` is driven over the DevTools protocol on a pipe (--remote-debugging-pipe:
no port is opened). The page is loaded from a file, and no request can leave it three times
over: Chromium runs in a network namespace of its own with no interface up (as root), every
request the page makes is paused and failed unless it is the page's own file, and each such
request is recorded so a test can say which one it was. What the page logs as an error, an
uncaught exception, and a refused request (a Content-Security-Policy violation is logged as
an error) are collected too.

    with Browser() as browser:
        page = browser.open(path)
        assert page.problems() == []
        page.screenshot(out_dir / "report.png")
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from tools import need

STEP_TIMEOUT_S = 30.0
WINDOW = (1280, 900)

# Every canvas on the page with a painted pixel, and every <svg> with the marks it draws
# (shapes with an area, or lines with a length). Charts are drawn on canvas (Chart.js) and
# flame graphs as SVG (d3-flame-graph); a chart whose data was lost draws axes at most.
MARKS_JS = """
(() => {
  const canvases = [...document.querySelectorAll('canvas')].map(canvas => {
    let painted = 0;
    try {
      const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
      for (let i = 3; i < data.length; i += 4) if (data[i] !== 0) painted++;
    } catch (error) { painted = -1; }
    return {id: canvas.id || (canvas.closest('[id]') || {}).id || '', painted: painted,
            width: canvas.width, height: canvas.height};
  });
  const svgs = [...document.querySelectorAll('svg')].map(svg => {
    const marks = [...svg.querySelectorAll('rect, path, circle, line, polyline, polygon')]
      .filter(shape => { const box = shape.getBBox(); return box.width > 0 || box.height > 0; });
    return {id: svg.id || (svg.closest('[id]') || {}).id || '', marks: marks.length};
  });
  return {canvases: canvases, svgs: svgs};
})()
"""


def chromium_path() -> Optional[str]:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def require_chromium() -> str:
    """Chromium's path; the test is skipped without it, naming `make browser` (tests/tools.py)."""
    need("chromium")
    path = chromium_path()
    assert path is not None
    return path


class PageLoadFailed(AssertionError):
    pass


class Page:
    """One loaded page of a Browser, and what happened while it loaded."""

    def __init__(self, browser: Browser, session: str, url: str) -> None:
        self.browser = browser
        self.session = session
        self.url = url
        self.console_errors: List[str] = []
        self.exceptions: List[str] = []
        self.blocked: List[str] = []  # requests to anything but the page itself
        self.allowed: Tuple[str, ...] = ()  # file:// directories a page of many files loads from

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises are awaited)."""
        reply = self.browser.command(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
            self.session,
        )
        if "exceptionDetails" in reply:
            raise AssertionError(f"{expression[:80]!r} threw: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    def settle(self) -> None:
        """Let the page finish drawing: two animation frames after everything it scheduled."""
        self.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
        self.browser.drain(self, 0.2)

    def marks(self) -> Dict[str, List[Dict[str, Any]]]:
        result = self.evaluate(MARKS_JS)
        assert isinstance(result, dict)
        return result

    def problems(self) -> List[str]:
        """Console errors, uncaught exceptions and requests that tried to leave the page."""
        self.browser.drain(self, 0.1)
        return (
            [f"console error: {text}" for text in self.console_errors]
            + [f"exception: {text}" for text in self.exceptions]
            + [f"request left the page: {url}" for url in self.blocked]
        )

    def screenshot(self, path: Path, full_page: bool = True) -> Path:
        """A PNG of the page (all of it, up to 8000 px tall) written to `path`."""
        params: Dict[str, Any] = {"format": "png"}
        if full_page:
            metrics = self.browser.command("Page.getLayoutMetrics", {}, self.session)
            size = metrics.get("cssContentSize") or metrics["contentSize"]
            height = min(int(size["height"]) + 1, 8000)
            params["clip"] = {"x": 0, "y": 0, "width": WINDOW[0], "height": height, "scale": 1}
            params["captureBeyondViewport"] = True
        reply = self.browser.command("Page.captureScreenshot", params, self.session)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(reply["data"]))
        return path


class Browser:
    """A headless Chromium, one per `with` block; pages are opened from files."""

    def __init__(self) -> None:
        self.binary = require_chromium()
        self.profile = tempfile.mkdtemp(prefix="probing-chromium-")
        self.pid: Optional[int] = None
        self.next_id = 0
        self.buffer = b""
        self.pages: Dict[str, Page] = {}

    def __enter__(self) -> Browser:
        to_browser_r, self.to_browser = os.pipe()
        self.from_browser, from_browser_w = os.pipe()
        argv = [
            self.binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
            f"--user-data-dir={self.profile}", "--no-first-run", "--no-default-browser-check",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-extensions", "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio",
            f"--window-size={WINDOW[0]},{WINDOW[1]}", "about:blank",
        ]  # fmt: skip
        if os.geteuid() == 0 and shutil.which("unshare"):
            argv = ["unshare", "--net", "--", *argv]
        # Chromium reads commands on fd 3 and writes replies on fd 4. Both ends are first moved
        # above 10, so putting one at 3 cannot close the other.
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_browser_r, from_browser_w)]
        actions = [
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
            (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
            (os.POSIX_SPAWN_DUP2, high[0], 3),
            (os.POSIX_SPAWN_DUP2, high[1], 4),
        ]
        try:
            self.pid = os.posix_spawnp(argv[0], argv, dict(os.environ), file_actions=actions, setsid=True)
        finally:
            for fd in (to_browser_r, from_browser_w, *high):
                os.close(fd)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pid is not None:
            try:
                self.command("Browser.close", {}, None, timeout=5.0)
            except Exception:
                pass
            deadline = time.monotonic() + 5.0
            while os.waitpid(self.pid, os.WNOHANG) == (0, 0):
                if time.monotonic() > deadline:
                    os.killpg(self.pid, signal.SIGKILL)
                    os.waitpid(self.pid, 0)
                    break
                time.sleep(0.05)
            self.pid = None
        for fd in (self.to_browser, self.from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)

    # --- the protocol -----------------------------------------------------------------------

    def send(self, method: str, params: Dict[str, Any], session: Optional[str]) -> int:
        self.next_id += 1
        message: Dict[str, Any] = {"id": self.next_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        os.write(self.to_browser, json.dumps(message).encode() + b"\0")
        return self.next_id

    def command(
        self, method: str, params: Dict[str, Any], session: Optional[str], timeout: float = STEP_TIMEOUT_S
    ) -> Dict[str, Any]:
        wanted = self.send(method, params, session)
        deadline = time.monotonic() + timeout
        while True:
            message = self.receive(deadline)
            if message is None:
                raise PageLoadFailed(f"chromium did not answer {method} in {timeout:.0f} s")
            if message.get("id") == wanted:
                if "error" in message:
                    raise PageLoadFailed(f"{method}: {message['error']}")
                return dict(message.get("result", {}))
            self.dispatch(message)

    def receive(self, deadline: float) -> Optional[Dict[str, Any]]:
        while b"\0" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self.from_browser], [], [], left)
            if not ready:
                return None
            chunk = os.read(self.from_browser, 1 << 20)
            if not chunk:
                raise PageLoadFailed("chromium exited")
            self.buffer += chunk
        raw, self.buffer = self.buffer.split(b"\0", 1)
        return dict(json.loads(raw))

    def drain(self, page: Page, seconds: float) -> None:
        """Handle the events that arrive within `seconds`."""
        deadline = time.monotonic() + seconds
        while True:
            message = self.receive(deadline)
            if message is None:
                return
            self.dispatch(message)

    def dispatch(self, event: Dict[str, Any]) -> None:
        page = self.pages.get(event.get("sessionId", ""))
        if page is None:
            return
        method, params = event.get("method"), event.get("params", {})
        if method == "Fetch.requestPaused":
            url = params["request"]["url"]
            if url == page.url.split("#")[0] or url.startswith(("data:", *page.allowed)):
                self.send("Fetch.continueRequest", {"requestId": params["requestId"]}, page.session)
            else:
                page.blocked.append(url)
                self.send(
                    "Fetch.failRequest",
                    {"requestId": params["requestId"], "errorReason": "BlockedByClient"},
                    page.session,
                )
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            page.console_errors.append(
                " ".join(str(arg.get("value", arg.get("description"))) for arg in params["args"])
            )
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            page.exceptions.append(
                str(details.get("exception", {}).get("description") or details.get("text"))
            )
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            page.console_errors.append(f"{params['entry'].get('source')}: {params['entry'].get('text')}")

    # --- pages ------------------------------------------------------------------------------

    def open(
        self,
        path: Path,
        width: int = WINDOW[0],
        height: int = WINDOW[1],
        fragment: str = "",
        allow: Sequence[Path] = (),
    ) -> Page:
        """Load the file at `path` (with `#fragment`) and wait until it has loaded and drawn.
        Files under the directories `allow` may be loaded too (a viewer of several files)."""
        url = Path(path).resolve().as_uri() + (f"#{fragment}" if fragment else "")
        target = self.command("Target.createTarget", {"url": "about:blank"}, None)["targetId"]
        session = self.command("Target.attachToTarget", {"targetId": target, "flatten": True}, None)[
            "sessionId"
        ]
        page = Page(self, session, url)
        page.allowed = tuple(Path(directory).resolve().as_uri() + "/" for directory in allow)
        self.pages[session] = page
        for method, params in (
            ("Page.enable", {}),
            ("Runtime.enable", {}),
            ("Log.enable", {}),
            ("Fetch.enable", {"patterns": [{"urlPattern": "*"}]}),
            ("Emulation.setDeviceMetricsOverride",
             {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}),
        ):  # fmt: skip
            self.command(method, params, session)
        self.send("Page.navigate", {"url": url}, session)
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while True:
            message = self.receive(deadline)
            if message is None:
                raise PageLoadFailed(f"{path} did not finish loading in {STEP_TIMEOUT_S:.0f} s")
            self.dispatch(message)
            if message.get("method") == "Page.loadEventFired" and message.get("sessionId") == session:
                break
        page.settle()
        return page


def screenshot_path(test_output: Path, name: str) -> Path:
    """Where a test writes the screenshot `name` (e.g. report.png): into the test's own output,
    or, when PROBING_SCREENSHOTS names a directory (`make screenshots`), there, for the docs."""
    chosen = os.environ.get("PROBING_SCREENSHOTS")
    return (Path(chosen) if chosen else test_output) / name
