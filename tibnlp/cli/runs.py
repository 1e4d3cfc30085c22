"""`tibnlp runs`: compare or plot an experiment's runs; replay tracking calls buffered during an
outage."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.markup import escape
from rich.table import Table

from tibnlp.cli.common import console, table_console
from tibnlp.errors import DataError
from tibnlp.tracking import sync_buffers
from tibnlp.tracking.buffer import default_buffer_dir, sqlite_file
from tibnlp.tracking.compare import compare_runs
from tibnlp.tracking.curve import pipeline_parent, plot_curve

app = typer.Typer(
    help="Compare and plot runs; replay buffered tracking calls.", no_args_is_help=True
)

UriOption = Annotated[
    str,
    typer.Option(
        "--tracking-uri",
        help="Store to read (never created): default $MLFLOW_TRACKING_URI, else "
        "sqlite:///mlflow.db.",
    ),
]


@app.command("compare")
def compare(
    experiment: Annotated[str, typer.Option("--experiment", "-e", help="Experiment name.")],
    metric: Annotated[
        list[str] | None,
        typer.Option(
            "--metric",
            "-m",
            help="Metric name or glob (repeatable); default test_accuracy and test_*f1.",
        ),
    ] = None,
    group_by: Annotated[
        list[str] | None,
        typer.Option(
            "--group-by", "-g", help="Param or tag:NAME to group by (default: model keys)."
        ),
    ] = None,
    columns_by: Annotated[
        str,
        typer.Option(help="Param or tag whose values become column suffixes (finetune.head)."),
    ] = "",
    fmt: Annotated[
        Literal["table", "markdown", "csv"], typer.Option("--format", "-f", help="Output format.")
    ] = "table",
    digits: Annotated[int, typer.Option(min=0, help="Decimals shown.")] = 4,
    filter_string: Annotated[
        str,
        typer.Option(
            "--filter", help="MLflow run filter, e.g. \"params.finetune.task = 'title'\"."
        ),
    ] = "",
    order: Annotated[
        Literal["start", "natural"],
        typer.Option(help="Rows in run order (a pipeline's variant order) or sorted by value."),
    ] = "start",
    percent: Annotated[
        bool,
        typer.Option(
            "--percent",
            help="Show fractions x100 (F1, precision, recall, accuracy, flip rates, shares, as "
            "papers print them); losses and counts stay as logged.",
        ),
    ] = False,
    tracking_uri: UriOption = "",
) -> None:
    """Runs side by side, grouped by model configuration: mean ± std over seeds."""
    if any(not m.strip() for m in metric or []):  # an empty pattern matches no metric
        raise typer.BadParameter("a metric name or glob cannot be empty", param_hint="--metric")
    result = compare_runs(
        experiment,
        metric or [],
        group_by or [],
        columns_by=columns_by,
        uri=tracking_uri,
        filter_string=filter_string,
        order=order,
    )
    scale = 100.0 if percent else 1.0
    if fmt == "markdown":
        typer.echo(result.markdown(digits, scale), nl=False)
    elif fmt == "csv":
        typer.echo(result.csv(scale), nl=False)
    else:
        table = Table(title=f"experiment {experiment}: mean ± std over runs")
        for i, head in enumerate(result.headers()):
            table.add_column(head, justify="left" if i < len(result.group_keys) else "right")
        for row in result.table(digits, scale):
            table.add_row(*row)
        table_console(stdout=True).print(table)  # as the csv and markdown forms are
    if result.left_out:  # (on stderr: a csv or markdown table on stdout stays clean)
        console.print(
            f"[yellow]left out:[/] runs with these metrics that are not finished "
            f"({result.left_out})",
            highlight=False,
        )


@app.command("plot")
def plot(
    experiment: Annotated[
        list[str], typer.Option("--experiment", "-e", help="Experiment name (repeatable).")
    ],
    output: Annotated[Path, typer.Option("--output", "-o", help="PNG file to write (FILE.png).")],
    metric: Annotated[
        str, typer.Option("--metric", "-m", help="Metric as fine-tuning logs it, less the part.")
    ] = "macro_f1",
    part: Annotated[
        list[str] | None,
        typer.Option("--part", help="Split(s) drawn (repeatable); default test and validation."),
    ] = None,
    run_id: Annotated[
        str,
        typer.Option(
            "--run-id",
            help="Log the PNG to this run; default: the latest pipeline parent run of the "
            "(first) experiment, when it has one.",
        ),
    ] = "",
    filter_string: Annotated[
        str, typer.Option("--filter", help="MLflow run filter applied to every experiment.")
    ] = "",
    title: Annotated[str, typer.Option(help="Figure title.")] = "",
    tracking_uri: UriOption = "",
) -> None:
    """Learning curve: fine-tuning scores against pretraining tokens and CPU-hours.

    Mean ± std over seeds, with the random-init twin, TextCNN and published results as
    references."""
    target = run_id or pipeline_parent(experiment[0], tracking_uri) or ""
    curve, skipped = plot_curve(
        experiment,
        output,
        metric,
        part or ["test", "validation"],
        tracking_uri,
        log_run_id=target,
        title=title,
        filter_string=filter_string,
    )
    for line in skipped:
        console.print(f"[yellow]left out:[/] {line}", highlight=False)
    console.print(f"{len(curve.points)} points; plot written to {output}", highlight=False)
    if target:
        console.print(f"logged to MLflow run {target}", highlight=False)


@app.command("sync")
def sync(
    buffer: Annotated[
        Path | None,
        typer.Argument(help="A buffer file or folder (default: .tibnlp/tracking-buffer)."),
    ] = None,
    tracking_uri: Annotated[
        str, typer.Option("--tracking-uri", help="Replay into this store instead.")
    ] = "",
) -> None:
    """Replay tracking calls buffered while the store was unreachable.

    Exit status: 0 when every call was sent; 1 when some wait for the store (run this again
    later); 2 when some could not be sent (damaged lines, calls the store refused, artifacts
    whose file is gone): they are kept in BUFFER.unsent to repair and sync by name; 2 too when
    the folder's ids.json is damaged (nothing is sent), or when calls wait on a run created
    offline that no sync can find."""
    if buffer is not None and not buffer.exists():
        raise DataError(f"buffer {buffer} does not exist", "give a buffer file or folder")
    target = sqlite_file(tracking_uri) if tracking_uri else None
    if target is not None and not target.is_file():  # a mistyped path made a new empty store
        raise DataError(
            f"--tracking-uri {tracking_uri}: no store at {target.absolute()}",
            "check the path; to replay into a new store there, create it first "
            f"(touch {target}; MLflow sets it up on first use)",
        )
    done = sync_buffers(buffer, tracking_uri)
    console.print(f"replayed {done.sent} buffered tracking calls; {done.left} buffer files left")
    if not done.buffers:
        where = buffer or default_buffer_dir()
        console.print(
            f"no buffer files in {escape(str(where))}"
            + ("" if where.exists() else " (no such folder: nothing was buffered)"),
            highlight=False,
        )
    for path in done.skipped:
        console.print(
            f"[yellow]skipped {escape(str(path))}: not a tracking buffer (its first line is no "
            "buffer header)[/]",
            soft_wrap=True,
        )
    for line in done.dropped:
        console.print(f"[yellow]not sent, the store refused it: {escape(line)}[/]", soft_wrap=True)
    for line in done.damaged:
        console.print(f"[yellow]not sent, damaged in the buffer: {escape(line)}[/]", soft_wrap=True)
    for line in done.missing:
        console.print(f"[yellow]not sent, its file is missing: {escape(line)}[/]", soft_wrap=True)
    for line in done.waiting:
        console.print(f"[yellow]kept: {escape(line)}; run this again later[/]", soft_wrap=True)
    for line in done.lost:
        console.print(f"[yellow]cannot be sent: {escape(line)}[/]", soft_wrap=True)
    unsent = done.dropped + done.damaged + done.missing
    if done.lost and not unsent:
        raise DataError(
            f"{len(done.lost)} buffer file(s) wait on a run that no sync can find (listed "
            "above); they are kept as they are"
            + ("; the other calls were replayed" if done.sent else ""),
            'add the run\'s entry ("offline-...": "RUN_ID", the id the store gave it) to '
            "ids.json beside the buffers, or repair the file named, and sync again; or delete "
            "the buffer file if its calls are not needed",
        )
    if unsent:
        count = len(unsent)
        files = ", ".join(str(p) for p in done.unsent)
        raise DataError(
            f"{count} buffered tracking call(s) could not be sent (listed above); they are "
            f"kept in {files or 'no file'}"
            + ("; the other calls were replayed" if done.sent else ""),
            "repair the lines there (one JSON record each, as listed) and run "
            f"`tibnlp runs sync {done.unsent[0] if done.unsent else 'FILE'}`, or delete the file "
            "if those calls are not needed",
        )
    if done.left:
        raise typer.Exit(1)
