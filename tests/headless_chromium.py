"""Load a page in a real headless Chromium and report what a person would see.

Chromium is driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``: JSON
messages separated by NUL bytes on file descriptors 3 and 4), so no websocket client or
browser-automation package is needed. Every network request is refused twice over (a proxy
on a closed port and a resolver that maps every host to nothing) and also recorded, so a page
that needs the network shows it as a request and as a broken figure.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["find_chromium", "PageView", "view_page"]


def find_chromium() -> str | None:
    """Path of a Chromium binary (``chromium`` as Debian names it), or None."""
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class PageView:
    """What the browser saw.

    Attributes
    ----------
    console_errors : list of str
        Console errors and warnings, uncaught exceptions and error log entries.
    requests : list of str
        URLs the page asked for other than itself and ``data:`` URIs.
    text : str
        The page's visible text (``document.body.innerText``).
    figures : list of dict
        Per ``img``: ``id`` (of its figure), ``x``, ``y``, ``width``, ``height`` on the
        page, ``natural_width`` (0 when the image did not decode).
    screenshot : bytes
        PNG of the whole page at 1 device pixel per CSS pixel.
    """

    console_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    text: str = ""
    figures: list[dict[str, Any]] = field(default_factory=list)
    screenshot: bytes = b""


class _Pipe:
    def __init__(self, binary: str, profile: str) -> None:
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        # the child's ends go to 10 and up first, so moving them to 3 and 4 clobbers nothing
        low = (to_chrome_r, from_chrome_w)
        to_chrome_r, from_chrome_w = (fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in low)
        for fd in low:
            os.close(fd)

        def protocol_fds() -> None:  # in the child: the protocol reads fd 3, writes fd 4
            os.dup2(to_chrome_r, 3)
            os.dup2(from_chrome_w, 4)

        self.proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
             f"--user-data-dir={profile}", "--no-first-run", "--no-default-browser-check",
             "--disable-extensions", "--disable-background-networking", "--disable-sync",
             "--disable-component-update", "--proxy-server=127.0.0.1:9",
             "--host-resolver-rules=MAP * ~NOTFOUND", "--hide-scrollbars", "about:blank"],
            # fds 3 and 4 must survive exec; every other fd Python opened is close-on-exec
            preexec_fn=protocol_fds, close_fds=False,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf = b""
        self._next = 0
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, params: dict[str, Any] | None = None,
             session: str | None = None, timeout: float = 60) -> dict[str, Any]:
        self._next += 1
        msg: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._read(timeout)
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, timeout: float = 60) -> dict[str, Any]:
        for ev in self.events:
            if ev.get("method") == method:
                return ev
        while True:
            ev = self._read(timeout)
            self.events.append(ev)
            if ev.get("method") == method:
                return ev

    def _read(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buf:
            if time.monotonic() > deadline:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self._from_chrome, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed the DevTools pipe")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_chrome)
        os.close(self._from_chrome)


_PROBE = """JSON.stringify({
  text: document.body.innerText,
  height: Math.ceil(document.documentElement.scrollHeight),
  figures: Array.from(document.images).map(img => {
    const r = img.getBoundingClientRect();
    return {id: (img.closest('figure') || img).id, x: r.left + scrollX, y: r.top + scrollY,
            width: r.width, height: r.height, natural_width: img.naturalWidth,
            complete: img.complete};
  })})"""


def view_page(path: Path, width: int = 1200, timeout: float = 90) -> PageView:
    """Open ``path`` (a local HTML file) in headless Chromium and describe what it showed.

    Raises
    ------
    FileNotFoundError
        If no Chromium is installed.
    """
    binary = find_chromium()
    if binary is None:
        raise FileNotFoundError("no chromium binary on PATH (apt-get install chromium)")
    url = Path(path).resolve().as_uri()
    view = PageView()
    with tempfile.TemporaryDirectory(prefix="ndb-chromium-") as profile:
        pipe = _Pipe(binary, profile)
        try:
            target = pipe.send("Target.createTarget", {"url": "about:blank"}, timeout=timeout)
            session = pipe.send("Target.attachToTarget", {"targetId": target["targetId"],
                                                          "flatten": True})["sessionId"]
            for domain in ("Page", "Runtime", "Log", "Network"):
                pipe.send(f"{domain}.enable", session=session)
            pipe.send("Emulation.setDeviceMetricsOverride", {
                "width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False},
                session=session)
            pipe.events.clear()
            pipe.send("Page.navigate", {"url": url}, session=session)
            pipe.wait_for("Page.loadEventFired", timeout)
            probe = json.loads(pipe.send("Runtime.evaluate", {
                "expression": _PROBE, "returnByValue": True}, session=session)
                ["result"]["value"])
            view.text, view.figures = probe["text"], probe["figures"]
            shot = pipe.send("Page.captureScreenshot", {
                "format": "png", "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": width, "height": probe["height"],
                         "scale": 1}}, session=session, timeout=timeout)
            view.screenshot = base64.b64decode(shot["data"])
        finally:
            pipe.close()
    for ev in pipe.events:
        method, params = ev.get("method"), ev.get("params", {})
        if method == "Runtime.exceptionThrown":
            view.console_errors.append(str(params.get("exceptionDetails", {}).get("text")))
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error",
                                                                               "warning"):
            view.console_errors.append(" ".join(str(a.get("value", a.get("description")))
                                                for a in params.get("args", [])))
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            view.console_errors.append(str(params["entry"].get("text")))
        elif method == "Network.requestWillBeSent":
            req_url = params.get("request", {}).get("url", "")
            if req_url != url and not req_url.startswith("data:"):
                view.requests.append(req_url)
    return view
