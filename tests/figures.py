"""Helpers for figure tests: the figure object of a written HTML page, a headless browser.

``figure_of(html)`` parses the ``Plotly.newPlot(id, data, layout, config)`` call that
plotly writes into the page, so tests inspect traces and axis ranges (plotly may escape
non-ASCII text as ``\\uXXXX``: grepping the HTML is not a test).

``render(html_path)`` opens the page in Debian's ``chromium`` (headless, sandbox off, no
network, a fresh profile), takes a screenshot and collects console errors; it returns
None when no browser is installed so tests can skip with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def figure_of(html: str) -> dict[str, Any]:
    """``{"data": [...], "layout": {...}}`` of the first plotly figure in the page."""
    key = "Plotly.newPlot("
    i = html.index(key) + len(key)
    dec = json.JSONDecoder()
    _id, i = dec.raw_decode(html, _skip(html, i))
    data, i = dec.raw_decode(html, _skip(html, i))
    layout, i = dec.raw_decode(html, _skip(html, i))
    return {"data": _decode(data), "layout": _decode(layout)}


def _decode(o: Any) -> Any:
    """Plotly writes numpy arrays as ``{"dtype": "f8", "bdata": base64, "shape": "2, 3"}``."""
    if isinstance(o, dict):
        if "bdata" in o and "dtype" in o:
            import base64

            import numpy as np

            a = np.frombuffer(base64.b64decode(o["bdata"]), dtype=np.dtype(o["dtype"]))
            if "shape" in o:
                a = a.reshape([int(v) for v in str(o["shape"]).split(",")])
            return a.tolist()
        return {k: _decode(v) for k, v in o.items()}
    if isinstance(o, list):
        return [_decode(v) for v in o]
    return o


def _skip(s: str, i: int) -> int:
    while s[i] in " \n\t,":
        i += 1
    return i


def browser() -> str | None:
    for b in BROWSERS:
        p = shutil.which(b)
        if p:
            return p
    return None


@dataclass(frozen=True)
class Rendered:
    png: Path
    png_bytes: int  # a blank 1400x900 page compresses to a few kB, a plot to tens
    report: dict[str, Any]  # what the page measured of itself (see _PROBE)

    @property
    def console_errors(self) -> list[str]:
        return list(self.report.get("errors", []))


# Collects errors before plotly runs.
_HOOK = """<script>window.__errs=[];window.addEventListener('error',function(e){
__errs.push(String(e.message))});var __ce=console.error;console.error=function(){
__errs.push(Array.from(arguments).join(' '));__ce.apply(console,arguments)};</script>"""

# After plotting: per subplot, the share of its width and height that the data covers;
# whether titles sit inside the page; whether a colorbar overlaps another subplot.
_PROBE = """<script>setTimeout(function(){
function bb(e){var r=e.getBoundingClientRect();return {l:r.left,r:r.right,t:r.top,b:r.bottom}}
function hit(a,b){return a.l<b.r-1&&b.l<a.r-1&&a.t<b.b-1&&b.t<a.b-1}
var out={errors:__errs,panels:[],titles_inside:true,colorbar_overlaps:0,traces:0};
var bgs=Array.from(document.querySelectorAll('rect.nsewdrag')).map(bb);
var marks=Array.from(document.querySelectorAll(
 '.scatterlayer .trace path.js-line, .scatterlayer .point, .heatmaplayer image, .hm image'))
 .map(bb).filter(function(m){return m.r>m.l||m.b>m.t});
out.traces=document.querySelectorAll('.scatterlayer .trace, .heatmaplayer .hm').length;
bgs.forEach(function(g){var l=1e9,r=-1e9,t=1e9,b=-1e9,n=0;marks.forEach(function(m){
 if(hit(m,g)||(m.l>=g.l-1&&m.r<=g.r+1&&m.t>=g.t-1&&m.b<=g.b+1)){n++;
 l=Math.min(l,Math.max(m.l,g.l));r=Math.max(r,Math.min(m.r,g.r));
 t=Math.min(t,Math.max(m.t,g.t));b=Math.max(b,Math.min(m.b,g.b))}});
 out.panels.push({marks:n,xspan:n?(r-l)/(g.r-g.l):0,yspan:n?(b-t)/(g.b-g.t):0})});
var sv=document.querySelector('.main-svg');
var sb=sv?bb(sv):{r:window.innerWidth,b:window.innerHeight};var W=sb.r,H=sb.b;
document.querySelectorAll('.gtitle, .g-xtitle text, .g-ytitle text').forEach(function(e){
 var x=bb(e);if(x.r>x.l&&(x.l<0||x.t<0||x.r>W+1||x.b>H+1))out.titles_inside=false});
document.querySelectorAll('.colorbar').forEach(function(c){var x=bb(c);
 bgs.forEach(function(g){if(hit(x,g))out.colorbar_overlaps++})});
var pre=document.createElement('pre');pre.id='__report';pre.textContent=JSON.stringify(out);
document.body.appendChild(pre)},1500)</script>"""


def _flags(profile: str) -> list[str]:
    return [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run",
        "--disable-extensions", "--disable-dev-shm-usage", f"--user-data-dir={profile}",
        "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>",
    ]  # fmt: skip


def render(
    html_path: Path, png_path: Path, *, size: tuple[int, int] = (1400, 900)
) -> Rendered | None:
    """Screenshot ``html_path`` in headless chromium and read the page's own measurements
    (``_PROBE``) from its DOM; None when there is no browser."""
    exe = browser()
    if exe is None:
        return None
    html = html_path.read_text(encoding="utf-8")
    probed = html.replace("<head>", "<head>" + _HOOK, 1).replace("</body>", _PROBE + "</body>")
    win = f"--window-size={size[0]},{size[1]}"
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "page.html"
        page.write_text(probed, encoding="utf-8")
        env = {**os.environ, "HOME": tmp}
        subprocess.run(
            [exe, *_flags(f"{tmp}/p1"), win, "--virtual-time-budget=4000",
             f"--screenshot={png_path}", html_path.resolve().as_uri()],
            capture_output=True, text=True, timeout=180, env=env,
        )  # fmt: skip
        dom = subprocess.run(
            [exe, *_flags(f"{tmp}/p2"), win, "--virtual-time-budget=4000", "--dump-dom",
             page.as_uri()],
            capture_output=True, text=True, timeout=180, env=env,
        )  # fmt: skip
    i = dom.stdout.find('<pre id="__report">')
    report: dict[str, Any] = {"errors": ["the page did not finish (no report in the DOM)"]}
    if i >= 0:
        j = dom.stdout.index("</pre>", i)
        import html as _html

        report = json.loads(_html.unescape(dom.stdout[i + len('<pre id="__report">') : j]))
    size_b = png_path.stat().st_size if png_path.exists() else 0
    return Rendered(png=png_path, png_bytes=size_b, report=report)
