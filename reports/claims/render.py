"""The claims report: every verdict grouped by topic, the arithmetic collapsible.

Markdown (``<details>`` blocks, which GitHub renders collapsed) or one self-contained
HTML page (no scripts, no external resources: it renders offline).
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Sequence

from reports.claims.verdict import VERDICTS, Verdict

BADGE = {
    "consistent": "#1a7f37",
    "inconsistent": "#cf222e",
    "needs an assumption": "#9a6700",
    "not checkable": "#57606a",
}


def _by_topic(verdicts: Sequence[Verdict]) -> dict[str, list[Verdict]]:
    out: dict[str, list[Verdict]] = {}
    for v in sorted(verdicts, key=lambda v: (v.claim.topic, v.claim.id)):
        out.setdefault(v.claim.topic, []).append(v)
    return out


def counts(verdicts: Sequence[Verdict]) -> dict[str, int]:
    c = Counter(v.verdict for v in verdicts)
    return {k: c.get(k, 0) for k in VERDICTS}


def _sens_rows(v: Verdict) -> list[tuple[str, str, str]]:
    rows = []
    for r in v.sensitivity:
        val = "—" if r["value"] is None else f"{r['value']:.4g}"
        rows.append(
            (
                f"{r['assumption']} = {r['at']:.4g} {r['unit']}".strip(),
                val,
                "holds" if r["holds"] else "does not hold",
            )
        )
    return rows


def markdown(verdicts: Sequence[Verdict]) -> str:
    c = counts(verdicts)
    lines = ["# Claims checked from first principles", ""]
    lines.append(", ".join(f"{n} {k}" for k, n in c.items()) + f" — {len(verdicts)} claims.")
    for topic, vs in _by_topic(verdicts).items():
        lines += ["", f"## {topic}", ""]
        for v in vs:
            cl = v.claim
            lines += [
                f"### `{cl.id}` — **{v.verdict}**",
                "",
                f"*{cl.paper.cite()}*",
                "",
                f"> {cl.quote}",
                "",
                f"Claim: {cl.stated.text()}. Check: `{cl.check}`.",
                "",
                f"Verdict: {v.explanation}.",
            ]
            if cl.notes:
                lines += ["", f"Note: {cl.notes}"]
            lines += ["", "<details><summary>arithmetic</summary>", ""]
            lines += ["| step | value |", "|---|---|"]
            lines += [f"| {k} | {val} |" for k, val in v.outcome.steps]
            if v.sensitivity:
                lines += ["", "| assumption | value | claim |", "|---|---|---|"]
                lines += [f"| {a} | {b} | {h} |" for a, b, h in _sens_rows(v)]
            lines += ["", "</details>", ""]
    return "\n".join(lines) + "\n"


CSS = """
body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#1f2328}
h2{border-bottom:1px solid #d0d7de;padding-bottom:.3em;margin-top:2em}
.claim{border:1px solid #d0d7de;border-radius:6px;padding:.8em 1em;margin:1em 0}
.badge{color:#fff;border-radius:1em;padding:.1em .7em;font-size:.85em;white-space:nowrap}
blockquote{margin:.5em 0;padding-left:1em;border-left:3px solid #d0d7de;color:#57606a}
table{border-collapse:collapse;margin:.5em 0;font-size:.9em}
td,th{border:1px solid #d0d7de;padding:.2em .6em;text-align:left;vertical-align:top}
summary{cursor:pointer;color:#0969da}
code{background:#f6f8fa;padding:.1em .3em;border-radius:3px}
"""


def _e(s: object) -> str:
    return html.escape(str(s))


def html_page(verdicts: Sequence[Verdict]) -> str:
    c = counts(verdicts)
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        "<title>perfmodel claims</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>Claims checked from first principles</h1>",
        "<p id='summary'>"
        + ", ".join(
            f"<span class='badge' style='background:{BADGE[k]}'>{n} {_e(k)}</span>"
            for k, n in c.items()
        )
        + f" — {len(verdicts)} claims</p>",
    ]
    for topic, vs in _by_topic(verdicts).items():
        parts.append(f"<h2>{_e(topic)}</h2>")
        for v in vs:
            cl = v.claim
            parts += [
                f"<div class='claim' id='{_e(cl.id)}' data-verdict='{_e(v.verdict)}'>",
                f"<b><code>{_e(cl.id)}</code></b> "
                f"<span class='badge' style='background:{BADGE[v.verdict]}'>{_e(v.verdict)}</span>",
                f"<div><i>{_e(cl.paper.cite())}</i></div>",
                f"<blockquote>{_e(cl.quote)}</blockquote>",
                f"<div>Claim: {_e(cl.stated.text())}. Check: <code>{_e(cl.check)}</code>.</div>",
                f"<div>Verdict: {_e(v.explanation)}.</div>",
            ]
            if cl.notes:
                parts.append(f"<div><small>Note: {_e(cl.notes)}</small></div>")
            parts.append("<details><summary>arithmetic</summary><table>")
            parts += [f"<tr><td>{_e(k)}</td><td>{_e(x)}</td></tr>" for k, x in v.outcome.steps]
            parts.append("</table>")
            if v.sensitivity:
                parts.append("<table><tr><th>assumption</th><th>value</th><th>claim</th></tr>")
                parts += [
                    f"<tr><td>{_e(a)}</td><td>{_e(b)}</td><td>{_e(h)}</td></tr>"
                    for a, b, h in _sens_rows(v)
                ]
                parts.append("</table>")
            parts.append("</details></div>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
