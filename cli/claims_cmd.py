"""``perfmodel claims``: list, check and report papers' quantitative claims."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli.common import JsonOpt, echo_json, fail, handle_errors, table, write_atomic

app = typer.Typer(
    help="Check papers' quantitative claims from first principles, with the arithmetic shown.",
    no_args_is_help=True,
)


@app.command("list")
@handle_errors
def list_cmd(json_out: bool = JsonOpt) -> None:
    """The built-in claims (one TOML file each): id, topic, paper, check."""
    from reports.claims.schema import load_library

    claims = load_library()
    if json_out:
        echo_json(claims)
        return
    rows = [(c.id, c.topic, c.paper.title[:40], c.check) for c in claims]
    typer.echo(table(rows, ["id", "topic", "paper", "check"]))
    typer.echo(f"{len(claims)} claims; `perfmodel claims check ID` shows the arithmetic")


@app.command("check")
@handle_errors
def check_cmd(
    claim: Annotated[
        str | None, typer.Argument(help="A claim id (`claims list`) or a claim .toml file.")
    ] = None,
    all_: Annotated[bool, typer.Option("--all", help="Check every built-in claim.")] = False,
    json_out: bool = JsonOpt,
) -> None:
    """Run a claim's check: verdict, the computed numbers and the sensitivity."""
    from reports.claims.run import check_claim
    from reports.claims.schema import find_claim, load_library

    if (claim is None) == (not all_):
        raise fail("give one claim id or file, or --all")
    claims = load_library() if all_ else [find_claim(str(claim))]
    verdicts = [check_claim(c) for c in claims]
    if json_out:
        echo_json(verdicts if all_ else verdicts[0])
        return
    for v in verdicts:
        c = v.claim
        typer.echo(f"{c.id}: {v.verdict.upper()}")
        typer.echo(f"  {c.paper.cite()}")
        typer.echo(f'  "{c.quote}"')
        typer.echo(f"  claim: {c.stated.text()}   check: {c.check}")
        typer.echo(f"  {v.explanation}")
        if v.outcome.steps:
            typer.echo("  " + table(v.outcome.steps, ["step", "value"]).replace("\n", "\n  "))
        if v.sensitivity:
            rows = [
                (
                    r["assumption"],
                    r["at"],
                    "—" if r["value"] is None else r["value"],
                    "holds" if r["holds"] else "no",
                )
                for r in v.sensitivity
            ]
            typer.echo(
                "  " + table(rows, ["assumption", "at", "value", "claim"]).replace("\n", "\n  ")
            )
        typer.echo("")
    if all_:
        from reports.claims.render import counts

        typer.echo(", ".join(f"{n} {k}" for k, n in counts(verdicts).items()))


@app.command("report")
@handle_errors
def report_cmd(
    out: Annotated[Path, typer.Option(help="claims.html or claims.md (by the suffix).")],
    force: Annotated[bool, typer.Option(help="Overwrite --out.")] = False,
) -> None:
    """One page with every verdict grouped by topic, the arithmetic collapsible."""
    from reports.claims.render import counts, html_page, markdown
    from reports.claims.run import check_claim
    from reports.claims.schema import load_library

    if out.suffix not in (".html", ".md"):
        raise fail(f"--out must end in .html or .md, got {out.name}")
    if out.exists() and not force:
        raise fail(f"{out} exists; pass --force to overwrite it")
    verdicts = [check_claim(c) for c in load_library()]
    text = html_page(verdicts) if out.suffix == ".html" else markdown(verdicts)
    write_atomic(out, text, force=force)
    typer.echo(f"wrote {out}: " + ", ".join(f"{n} {k}" for k, n in counts(verdicts).items()))
