"""`tibnlp data`: what the manifests know and what the data directory holds."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from tibnlp.cli.common import console
from tibnlp.data.datadir import check_data_dir, data_dir, link_into
from tibnlp.data.manifests import all_manifests, status_ok

app = typer.Typer(
    help="Datasets and corpora in the data directory ($TIBNLP_DATA).", no_args_is_help=True
)


@app.command("list")
def list_datasets(
    verify: Annotated[
        bool, typer.Option(help="Check sha256 of every file (else only that each is there).")
    ] = True,
) -> None:
    """Known datasets and corpora, and whether each is present with matching checksums.

    Exits 1 when one is damaged (partial, a checksum mismatch, a broken link, unreadable, a folder
    without its files; for a set you download, which has no checksums: some split files
    only, several archives, a damaged archive). A dataset absent is not an error: each
    command names the one it needs."""
    root = data_dir()
    check_data_dir(root)
    table = Table(title=f"data directory: {root}")
    for col in ("name", "kind", "folder", "status", "license"):
        table.add_column(col, overflow="fold")
    damaged: list[str] = []
    downloads: list[str] = []  # what to do for a damaged set no copy holds (tncc_document)
    for m in all_manifests().values():
        status = m.status(verify)
        ok = status_ok(status)
        style = "green" if ok else "red" if status != "missing" else "yellow"
        table.add_row(m.name, m.kind, m.root, f"[{style}]{escape(status)}[/]", m.license)
        if not ok and status != "missing":
            damaged.append(f"{m.name} in {m.path}: {status}")
            if not m.files and m.download:
                downloads.append(f"{m.name}: {m.download}")
    console.print(table)
    if damaged:
        console.print(f"[red]damaged:[/] {escape('; '.join(damaged))}", soft_wrap=True)
        console.print(
            "[yellow]hint:[/] restore the files named (make them readable where it says "
            "unreadable), or remove the entry and link a complete copy: `tibnlp data link "
            "SOURCE_DIR` replaces broken links but leaves other existing entries alone",
            soft_wrap=True,
        )
        for line in downloads:
            console.print(f"[yellow]hint:[/] {escape(line)}", soft_wrap=True)
        raise typer.Exit(1)


@app.command("link")
def link(
    source: Annotated[
        Path, typer.Argument(help="A folder with dataset folders (or data/ and corpora/).")
    ],
) -> None:
    """Symlink an existing copy of the datasets into the data directory (no copying)."""
    roots = {m.root for m in all_manifests().values()}
    linked, kept = link_into(source, names=roots)
    console.print(f"linked {len(linked)} folder(s) into {data_dir()}: {', '.join(linked) or '-'}")
    if kept:  # say what was not linked and why: a link to an older copy stays in use
        same = [name for name, what in kept.items() if what == "already linked"]
        parts = [f"{', '.join(same)} (already linked)"] if same else []
        parts += [f"{name} ({what})" for name, what in kept.items() if name not in same]
        console.print(
            f"left {len(kept)} existing entr{'y' if len(kept) == 1 else 'ies'} "
            f"alone: {'; '.join(parts)}"
        )
        if len(same) < len(kept):  # an entry in the way of this copy: say how to replace it
            console.print(
                f"to use {escape(str(source))} for those, remove them from "
                f"{escape(str(data_dir()))} and link again",
                soft_wrap=True,
            )
