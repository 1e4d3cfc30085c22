"""`tibnlp finetune`: TNCC and the other labelled sets, with baselines, in one results table."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from tibnlp.cli.common import ConfigOption, SetOption, console, resolve_config, table_console
from tibnlp.config import Config
from tibnlp.config.finetune import TaskName
from tibnlp.data.tasks import classification_datasets
from tibnlp.errors import ConfigError
from tibnlp.evaluation.report import (
    not_learning_seeds,
    rich_table,
    select_best,
    summary_dict,
    system_cell,
)
from tibnlp.evaluation.result_loader import load_one_result, load_results
from tibnlp.evaluation.significance import compare_rows, pool_pair
from tibnlp.stopping import exit_status
from tibnlp.training.finetune import run_finetune

app = typer.Typer(help="Fine-tune and evaluate classifiers.", no_args_is_help=True)

ModelOpt = Annotated[
    str | None,
    typer.Option(help="Pretrained model directory; 'none': random init (baseline)."),
]
HeadOpt = Annotated[
    str | None,
    typer.Option(help="cnn (TextCNN), linear or mlp (on finetune.pooling: auto, cls or cls_max)."),
]
EncoderOpt = Annotated[
    str | None,
    typer.Option(help="albert, or none: TextCNN on SentencePiece pieces from scratch."),
]
VocabOpt = Annotated[str | None, typer.Option(help="Vocabulary directory (no --model).")]
SeedsOpt = Annotated[str | None, typer.Option(help="Comma-separated seeds, e.g. 1,2,3.")]
EvalAlsoOpt = Annotated[str | None, typer.Option("--eval-also", help="Also evaluate on: advts.")]
WaitOpt = Annotated[
    bool, typer.Option("--wait", help="If another run holds the output folder, wait for it.")
]


def _flags(
    model: str | None,
    head: str | None,
    encoder: str | None,
    vocab: str | None,
    seeds: str | None,
    eval_also: str | None,
) -> list[str]:
    flags = []
    if model is not None:
        flags.append(f"finetune.model={'' if model == 'none' else model}")
    for key, value in (("head", head), ("encoder", encoder), ("vocab", vocab)):
        if value is not None:
            flags.append(f"finetune.{key}={value}")
    # `is not None`: an empty --seeds "" must be refused, not run the config's seeds, and an
    # empty --eval-also "" turns off what a config file asks for
    if seeds is not None:
        if seeds.strip() and not all(s.strip() for s in seeds.split(",")):  # "1,,2", "1,"
            raise typer.BadParameter(
                f"{seeds!r} has an empty item; give whole numbers separated by commas, e.g. 1,2,3",
                param_hint="--seeds",
            )
        flags.append(f"finetune.seeds=[{seeds}]")
    if eval_also is not None:
        flags.append(f"finetune.eval_also=[{eval_also}]")
    return flags


def _print_table(rows: list[dict], stdout: bool = False) -> None:
    """On stderr beside a training's log; on stdout where the table is what the command makes
    (`finetune report > table.txt`)."""
    table_console(stdout).print(rich_table(rows))


def _run(cfg: Config, dataset: str, task: TaskName = "title", wait: bool = False) -> None:
    """`run_finetune`, and on Ctrl-C what stays and what the same command does next (a seed
    keeps no checkpoint: the one cut short starts over, a soup at the copy it was on)."""
    try:
        result = run_finetune(cfg, dataset, task, wait)
    except KeyboardInterrupt as stop:
        if os.environ.get("RANK", "0") == "0":  # once, not once per process
            console.print(
                f"interrupted: the seeds that finished stay under {cfg.finetune.output}; run "
                "the same command again to go on: they are reported, not retrained, and the "
                "seed that was cut short starts over",
                soft_wrap=True,
            )
        raise SystemExit(exit_status(stop)) from None
    _finish(result.output, summary_dict(result))


def _finish(result_dir: Path, row: dict) -> None:
    _print_table([row])
    for key, value in row["notes"].items():
        console.print(f"  {key}: {value}")
    console.print(f"results and classifiers: {result_dir}")


@app.command("tncc")
def tncc(
    task: Annotated[str, typer.Option(help="title or document.")] = "title",
    model: ModelOpt = None,
    head: HeadOpt = None,
    encoder: EncoderOpt = None,
    vocab: VocabOpt = None,
    seeds: SeedsOpt = None,
    eval_also: EvalAlsoOpt = None,
    wait: WaitOpt = False,
    config: ConfigOption = None,
    set_: SetOption = None,
) -> None:
    """TNCC (published 7422/927/927 title split, or the document task when downloaded)."""
    # the dataset too: a config file's other dataset is not what this run reads or logs
    flags = ["finetune.dataset=tncc", f"finetune.task={task}"]
    flags += _flags(model, head, encoder, vocab, seeds, eval_also)
    cfg = resolve_config(config, set_, *flags)
    if cfg.finetune.dataset != "tncc":  # (a --set comes after the flags)
        raise ConfigError(
            f"config key 'finetune.dataset': `finetune tncc` reads TNCC, not "
            f"'{cfg.finetune.dataset}'",
            f"for that set: tibnlp finetune classify --dataset {cfg.finetune.dataset}",
        )
    _run(cfg, "tncc", cfg.finetune.task, wait)


@app.command("classify")
def classify(
    dataset: Annotated[
        str | None,
        typer.Option(
            help=f"A shipped set ({', '.join(classification_datasets())}) or the folder of your "
            "own: train.jsonl, validation.jsonl, test.jsonl ('text', 'label'; optional "
            "labels.json, dataset.yaml). A value with a path separator (./my_set) is a folder; a "
            "shipped set's name is that set; another name is a folder if one exists. "
            "Default: finetune.dataset of -c FILE."
        ),
    ] = None,
    model: ModelOpt = None,
    head: HeadOpt = None,
    encoder: EncoderOpt = None,
    vocab: VocabOpt = None,
    seeds: SeedsOpt = None,
    eval_also: EvalAlsoOpt = None,
    wait: WaitOpt = False,
    config: ConfigOption = None,
    set_: SetOption = None,
) -> None:
    """Any labelled set of the data directory by its name, or a folder of your own."""
    set_in = any(o.replace(" ", "").startswith("finetune.dataset=") for o in set_ or [])
    if dataset is None and config is None and not set_in:
        raise typer.BadParameter(
            "name the labelled set: a shipped set (e.g. tusa) or ./FOLDER, or give -c FILE "
            "that sets finetune.dataset",
            param_hint="--dataset",
        )
    named = [f"finetune.dataset={dataset}"] if dataset is not None else []
    flags = [*named, *_flags(model, head, encoder, vocab, seeds, eval_also)]
    cfg = resolve_config(config, set_, *flags)
    # the task as set (-c FILE, --set): TNCC's document task was read as the title task
    _run(cfg, cfg.finetune.dataset, cfg.finetune.task, wait)


@app.command("report")
def report(
    paths: Annotated[list[Path], typer.Argument(help="results.json files or folders.")],
    select: Annotated[
        bool,
        typer.Option(
            "--select",
            help="Keep, per dataset and system, the run with the best validation macro-F1 "
            "(a recipe search's choice) and show its recipe.",
        ),
    ] = False,
) -> None:
    """Put several runs (pretrained model and baselines) in one table."""
    rows = load_results(paths, sourced=True)
    _print_table(select_best(rows) if select else rows, stdout=True)


@app.command("compare")
def compare(
    result_a: Annotated[Path, typer.Argument(help="System A: a results.json or its folder.")],
    result_b: Annotated[Path, typer.Argument(help="System B, scored on the same items.")],
    part: Annotated[str, typer.Option(help="test or validation (or advts, ...).")] = "test",
    metric: Annotated[str, typer.Option(help="macro_f1, weighted_f1 or accuracy.")] = "macro_f1",
    resamples: Annotated[int, typer.Option(min=100, help="Bootstrap resamples.")] = 2000,
    level: Annotated[float, typer.Option(min=0.5, max=0.999, help="Interval level.")] = 0.95,
    seed: Annotated[int, typer.Option(help="The resampling's random seed.")] = 0,
    pool: Annotated[
        list[Path] | None,
        typer.Option(
            help="More runs of system A (e.g. other pretraining seeds): A's score is the mean "
            "over all their seeds, each weighing the same; seeds are not paired with B's."
        ),
    ] = None,
    pool_b: Annotated[
        list[Path] | None,
        typer.Option(
            "--pool-b",
            help="More runs of system B (e.g. more fine-tuning seeds of it), as --pool for A.",
        ),
    ] = None,
) -> None:
    """Is A above B? Their seed-mean difference, with a paired-bootstrap interval.

    The interval is over the items: the seeds' spread does not show how much another test
    sample would move it."""
    runs_a = [load_one_result(p) for p in [result_a, *(pool or [])]]
    runs_b = [load_one_result(p) for p in [result_b, *(pool_b or [])]]
    row_a, row_b = pool_pair(runs_a, runs_b, part)
    d = compare_rows(row_a, row_b, part, metric, resamples, level, seed)
    name = f"{part} {metric.replace('_', '-')}"
    console.print(
        escape(
            f"{row_a['dataset']} {name} over {d.items} items, {len(row_a['seeds'])} and "
            f"{len(row_b['seeds'])} seeds, {d.resamples} paired resamples of the items"
        ),
        soft_wrap=True,
    )
    for tag, row, score in (("A", row_a, d.a), ("B", row_b, d.b)):
        console.print(
            escape(f"  {tag} {system_cell(row)}: {100 * score:.2f} (mean over seeds)"),
            soft_wrap=True,
        )
    stuck = [tag for tag, row in (("A", row_a), ("B", row_b)) if not_learning_seeds(row)]
    if stuck:  # as `finetune report` marks it: a score at the majority class is not a result
        console.print(
            f"[yellow]warning:[/] {' and '.join(stuck)} {'has' if len(stuck) == 1 else 'have'} "
            "seeds that did not learn (validation macro-F1 at the majority-class level): the "
            "difference below is not a comparison of two results",
            soft_wrap=True,
        )
    console.print(
        f"  A - B: {100 * d.diff:+.2f}, {100 * d.level:g}% interval {d.interval()}; "
        f"A is not above B in {100 * d.not_above:.1f}% of resamples",
        soft_wrap=True,
    )
