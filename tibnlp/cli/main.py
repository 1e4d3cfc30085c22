"""Entry point: registers the command groups and turns user errors into clean exits."""

from __future__ import annotations

import os
import signal
import sys
import warnings

import typer
from rich.markup import escape

from tibnlp.cli import corpus, data, export, finetune, pipeline, predict, pretrain, runs, ui, vocab
from tibnlp.cli import model as model_cli
from tibnlp.cli.common import console
from tibnlp.errors import TibnlpError, shown_here
from tibnlp.stopping import exit_status, stop_on_signals, stopped_by_signal
from tibnlp.training import worker_exit

app = typer.Typer(
    name="tibnlp",
    help="Tibetan NLP: corpus, vocabulary, ALBERT pretraining, TNCC fine-tuning, in MLflow.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
# In the order of the workflow: data -> corpus -> vocab -> model/pretrain -> finetune -> runs.
app.add_typer(data.app, name="data")
app.add_typer(corpus.app, name="corpus")
app.add_typer(vocab.app, name="vocab")
app.add_typer(model_cli.app, name="model")
app.command("pretrain")(pretrain.pretrain)
app.add_typer(finetune.app, name="finetune")
app.command("predict")(predict.predict)
app.add_typer(pipeline.app, name="pipeline")
app.add_typer(runs.app, name="runs")
app.command("ui")(ui.ui)
app.add_typer(export.app, name="export")


def one_outage_line() -> None:
    """The tracker says a store is unreachable twice: a log line (what a CLI user reads) and a
    TrackingOutageWarning (for library callers and tests). The CLI shows the line only."""
    warnings.filterwarnings("ignore", message=r"tracking store .* is unreachable")


# what a Unix tool killed by SIGPIPE reports (`yes | head -1`): its reader stopped reading
STDOUT_CLOSED = 128 + signal.SIGPIPE


def stdout_closed(exc: SystemExit) -> bool:
    """Whether the reader of stdout went away (`tibnlp predict ... | head -1`): typer ends a
    command whose write met a broken pipe with exit 1 raised while handling it, and output
    still buffered meets it in the flush here. Then stdout is pointed at /dev/null, so the
    interpreter's last flush has nowhere to fail either (the pattern of Python's signal docs).
    """
    if sys.stdout is None:  # started with fd 1 closed (`>&-`): nothing was there to read
        return False
    gone = isinstance(exc.__context__, BrokenPipeError)
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        gone = True
    except (OSError, ValueError):  # another failure is not a reader gone: the code stands
        return gone
    if gone:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return gone


def main() -> None:
    one_outage_line()
    stop_on_signals()  # SIGTERM and SIGHUP leave through the same clean-up as Ctrl-C
    try:
        app(standalone_mode=True)
    except SystemExit as exc:  # how click ends every command, success included
        code = exc.code
        if stopped_by_signal() and code not in (0, None):  # (click's "Aborted!" is 1)
            code = exit_status()
        elif stdout_closed(exc):  # a reader that has read enough: no error, as Unix tools
            code = STDOUT_CLOSED
        worker_exit.end(code)
        raise SystemExit(code) from None
    except TibnlpError as exc:
        # the message and hint are text (paths, keys, pieces), never markup: a `[x]` in a
        # path would otherwise vanish from the one line that names it
        if shown_here(exc.message, alone=exc.alone):  # once per run, not once per process
            console.print(f"[bold red]error:[/] {escape(exc.message)}")
            if exc.hint:
                console.print(f"[yellow]hint:[/] {escape(exc.hint)}")
        worker_exit.end(exc.exit_code)
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
