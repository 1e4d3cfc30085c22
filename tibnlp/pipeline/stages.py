"""The built-in stage kinds: thin adapters from a `StageContext` to the toolkit's stage functions.

Each adapter imports its function (by name, checked like any import) only when it runs, so a
pipeline can be planned (and tested) without the heavy layers. Where a function writes is
decided here: always inside `ctx.output`. Each declares (`@accepts`) the inputs and params it
reads: the pipeline file is checked against that when it loads.
"""

from __future__ import annotations

import lzma
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tibnlp.errors import ConfigError, DataError, TibnlpError
from tibnlp.pipeline.context import StageContext, accepts


def _fresh(path: Path) -> Path:
    """A stage that cannot resume midway restarts cleanly inside its partial directory."""
    if path.exists():
        shutil.rmtree(path)
    return path


def _as_dict(value: Any) -> dict[str, Any]:
    """A stage's result as a flat dict: `aggregate` {part: {metric: (mean, std)}} becomes
    `part_metric` (mean) and `part_metric_std`; dataclasses become their fields."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return dict(value)
    out: dict[str, Any] = {}
    aggregate = getattr(value, "aggregate", None)
    if isinstance(aggregate, dict):
        for part, metrics in aggregate.items():
            for metric, stats in metrics.items():
                mean, std = stats if isinstance(stats, (tuple, list)) else (stats, 0.0)
                out[f"{part}_{metric}"] = mean
                out[f"{part}_{metric}_std"] = std
    for key in ("system", "dataset"):
        if hasattr(value, key):
            out[key] = str(getattr(value, key))
    if getattr(value, "output", None):
        out["model_dir"] = str(value.output)
    return out


def _optional(ctx: StageContext, key: str) -> Path | None:
    if isinstance(ctx.inputs, dict) and key in ctx.inputs:
        return ctx.inputs[key]
    return None


def _named(ctx: StageContext, key: str) -> Path:
    path = _optional(ctx, key)
    if path is None:
        raise ConfigError(
            f"stage {ctx.name}: needs an input named '{key}' (inputs: {{{key}: ...}})"
        )
    return path


def _documents(path: Path) -> Iterator[str]:
    """Blank-line separated documents of a plain or .xz text file, streamed."""
    opener = lzma.open if path.suffix == ".xz" else open
    lines: list[str] = []
    with opener(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                lines.append(line.rstrip("\n"))
            elif lines:
                yield "\n".join(lines)
                lines = []
    if lines:
        yield "\n".join(lines)


def whole_param(params: dict[str, Any], name: str, default: int, minimum: int) -> int:
    """A whole-number param (`400`, `"400"` from a quoted `${vars.docs}`, `1e6`), or a
    ConfigError naming it."""
    value = params.get(name, default)
    try:
        number = float(value) if not isinstance(value, bool) else float("nan")
    except (TypeError, ValueError):
        number = float("nan")
    if not (number.is_integer() and number >= minimum):  # nan and inf fail is_integer()
        raise ConfigError(
            f"params.{name}: {value!r} is not a whole number >= {minimum}",
            f"give params.{name} (or the variable it reads) a number",
        )
    return int(number)


def _slice_params(params: dict[str, Any]) -> None:
    whole_param(params, "max_docs", 1000, 1)
    whole_param(params, "max_chars", 0, 0)


def _finetune_params(params: dict[str, Any]) -> None:
    if "export_tokens" in params:
        whole_param(params, "export_tokens", 0, 1)


@accepts(files=True, params=("max_docs", "max_chars"), check=_slice_params)
def slice_corpus(ctx: StageContext) -> Path:
    """The first `max_docs` documents (at most `max_chars` characters; 0: no cap) of each
    input file.

    For smoke tests and quick starts on a reproducible slice of a real corpus.
    """
    max_docs = whole_param(ctx.params, "max_docs", 1000, 1)
    max_chars = whole_param(ctx.params, "max_chars", 0, 0)
    files = list(ctx.inputs.values()) if isinstance(ctx.inputs, dict) else list(ctx.inputs)
    if not files:
        raise ConfigError(f"stage {ctx.name}: give the corpus files to slice as inputs")
    out = ctx.output / "slice.txt"
    with out.open("w", encoding="utf-8") as fh:
        for path in files:
            chars = 0
            try:
                for i, doc in enumerate(_documents(Path(path))):
                    if i >= max_docs or (max_chars and chars >= max_chars):
                        break
                    fh.write(doc + "\n\n")
                    chars += len(doc)
            except (UnicodeDecodeError, lzma.LZMAError, EOFError) as exc:
                # a bare traceback otherwise, from inside the codec
                raise DataError(
                    f"stage {ctx.name}: {path} is not UTF-8 text (plain or .xz): {exc}",
                    "convert it to UTF-8 (a cut or truncated file: copy it whole again)",
                ) from exc
    return out


@accepts(files=True)
def prepare(ctx: StageContext) -> tuple[Path, dict[str, Any]]:
    files = list(ctx.inputs.values()) if isinstance(ctx.inputs, dict) else list(ctx.inputs)
    out = _fresh(ctx.output / "corpus")
    from tibnlp.text.prepare import prepare_corpus

    report = prepare_corpus(files, out, ctx.config.corpus)
    return out, _as_dict(report)


@accepts(needs=("corpus",))
def vocab(ctx: StageContext) -> tuple[Path, dict[str, Any]]:
    corpus = _named(ctx, "corpus")
    out = _fresh(ctx.output / "vocab")
    from tibnlp.text.vocab_build import build_vocabulary

    report = build_vocabulary(corpus, out, ctx.config.vocab)
    return out, _as_dict(report)


# The config settings each adapter sets itself, and from what: the input of that name, or ""
# for the stage's own output folder. What the pipeline's config says for them never reaches the
# stage, so they stay out of its cache key (`tibnlp.pipeline.planner`): keep these in step with
# the adapters below.
PRETRAIN_FILLS = (
    ("pretrain.corpus", "corpus"),
    ("pretrain.vocab", "vocab"),
    ("pretrain.init_from", "init"),
    ("pretrain.output", ""),
)
FINETUNE_FILLS = (
    ("finetune.model", "model"),
    ("finetune.vocab", "vocab"),
    ("finetune.static_vectors", "static"),
    ("finetune.output", ""),
)


@accepts(needs=("corpus", "vocab"), may=("init",))
def pretrain(ctx: StageContext) -> Path:
    cfg = ctx.config
    cfg.pretrain.corpus = str(_named(ctx, "corpus"))
    cfg.pretrain.vocab = str(_named(ctx, "vocab"))
    init = _optional(ctx, "init")  # a model directory to continue from (pretrain.init_from)
    if init is not None:
        cfg.pretrain.init_from = str(init)
    output = ctx.output / "model"
    cfg.pretrain.output = str(output)
    from tibnlp.training.checkpoint import latest_tag
    from tibnlp.training.pretrain import run_pretraining

    # An interrupted stage continues from its last complete checkpoint; one stopped before the
    # first checkpoint starts again (run_pretraining refuses both "resume from nothing" and
    # "start over existing checkpoints").
    resume = ctx.resume and latest_tag(output / "checkpoints") is not None
    if ctx.resume and not resume:
        _fresh(output)
    return Path(run_pretraining(cfg, resume=resume))


def _export(model: Path, tokens: int, stage: str) -> Path:
    """The export of pretraining output `model` (OUTPUT/model) at `tokens` (param
    `export_tokens`: a point of a learning curve)."""
    from tibnlp.models.io import read_extra
    from tibnlp.training.pretrain_record import export_name

    name = export_name(tokens)
    path = model.parent / "exports" / name
    if not path.is_dir():
        exports = sorted((model.parent / "exports").glob("tokens-*"))
        reached = read_extra(model).get("tokens", "?")
        raise DataError(
            f"stage {stage}: pretraining in {model.parent} has no export {name} (it stopped "
            f"at {reached} tokens; exports: {', '.join(e.name for e in exports) or 'none'})",
            "list only token counts that pretraining reaches (pretrain.max_tokens, "
            "pretrain.max_steps, pretrain.time_budget), the same as pretrain.export_at_tokens",
        )
    return path


def finetune_data(config: dict[str, Any]) -> dict[str, str]:
    """The dataset files a fine-tuning stage reads by name (`finetune.dataset`, and AdvTS
    with `eval_also`), as `ROOT/FILE` -> content hash. They are no input of the stage, so its
    key does not hold them: the plan compares these with the cached output's, or a corrected
    dataset file (or another data directory) would leave the old scores cached. A dataset or
    file absent here is left out: the stage names what is missing when it runs. A folder of
    one's own gives its files as `NAME/FILE` (`folder_files`: one not there is recorded as
    absent, so adding it reruns); a relative folder counts from the current
    directory, where the stage runs, as the config's other paths do."""
    from tibnlp.data.folder_set import folder_files, is_folder_dataset
    from tibnlp.data.manifests import get_manifest
    from tibnlp.data.tasks import manifest_of
    from tibnlp.tracking import path_hash

    ft = config.get("finetune") or {}
    dataset = str(ft.get("dataset", "tncc"))
    names = [manifest_of(dataset, str(ft.get("task", "title")))]
    if "advts" in (ft.get("eval_also") or []):
        names.append("advts")
    out: dict[str, str] = {}
    folder = Path(dataset).expanduser()
    if is_folder_dataset(dataset) and folder.is_dir():
        out.update(folder_files(folder))
    for name in filter(None, names):
        try:
            manifest = get_manifest(name)
        except TibnlpError:
            continue
        read = [*manifest.splits.values(), *manifest.targets.values(), manifest.labels_file]
        files = [manifest.path / rel for rel in sorted({r for r in read if r})]
        if not any(f.is_file() for f in files):  # e.g. the TNCC document zip
            files = [manifest.path] if manifest.path.is_dir() else []
        for path in files:
            if path.exists():
                rel = path.relative_to(manifest.path).as_posix()
                out[manifest.root if rel == "." else f"{manifest.root}/{rel}"] = path_hash(path)
    return out


@accepts(may=("model", "vocab", "static"), params=("export_tokens",), check=_finetune_params)
def finetune(ctx: StageContext) -> dict[str, Any]:
    cfg = ctx.config
    model = _optional(ctx, "model")
    if model is not None and "export_tokens" in ctx.params:
        model = _export(model, whole_param(ctx.params, "export_tokens", 0, 1), ctx.name)
    if model is not None:
        cfg.finetune.model = str(model)
    vocab = _optional(ctx, "vocab")  # e.g. a vocab stage's output (TextCNN)
    if vocab is not None:
        cfg.finetune.vocab = str(vocab)
    static = _optional(ctx, "static")  # the static channel's vectors (a pretraining output)
    if static is not None:
        cfg.finetune.static_vectors = str(static)
    # Not cleared on resume: run_finetune reports seeds that finished (same fingerprint) as
    # they are and trains only the rest.
    cfg.finetune.output = str(ctx.output / "finetune")
    tag_finetune_data(ctx)
    from tibnlp.training.finetune import run_finetune

    value = run_finetune(cfg, cfg.finetune.dataset, cfg.finetune.task)
    result = _as_dict(value)
    register_finetuned(ctx, result, value)
    return result


def tag_finetune_data(ctx: StageContext) -> None:
    """Tag the stage's run with the content hash of the dataset files it reads by name
    (`finetune_data`): they are no input of the stage, so the runner's provenance tags left
    the run (and the model registered from it) without any data hash."""
    from tibnlp.config import to_dict
    from tibnlp.tracking.conventions import TAG_DATA, config_hash

    files = finetune_data({"finetune": to_dict(ctx.config.finetune)})
    if files:
        ctx.tracker.set_tags({TAG_DATA: config_hash(files)})


@accepts(files=True, params=("metric", "parts", "title"))
def curve(ctx: StageContext) -> tuple[Path, dict[str, Any]]:
    """The learning curve of the fine-tuning stages given as inputs (their seed runs, read
    from MLflow by id: exactly the runs behind those outputs, cached or not), logged to the
    pipeline's parent run, and their result table as the pipeline's summary."""
    tracking = ctx.config.tracking
    if not tracking.enabled:
        raise ConfigError(
            f"stage {ctx.name} reads the fine-tuning runs from MLflow",
            "set tracking.enabled=true",
        )
    dirs = list(ctx.inputs.values()) if isinstance(ctx.inputs, dict) else list(ctx.inputs)
    from tibnlp.evaluation.report import summary_table
    from tibnlp.evaluation.result_loader import load_results
    from tibnlp.tracking.curve import plot_curve as plot

    rows = load_results(dirs)
    run_ids = [s["run_id"] for r in rows for s in r["seeds"] if s.get("run_id")]
    out = ctx.output / "curve.png"

    metric = str(ctx.params.get("metric", "macro_f1"))
    curve, skipped = plot(
        [tracking.experiment],
        out,
        metric,
        list(ctx.params.get("parts", ["test", "validation"])),
        uri=tracking.uri,
        run_ids=run_ids,
        log_run_id=tracking.parent_run_id,
        title=str(ctx.params.get("title", "")),
    )
    ctx.tracker.log_artifact(out)
    table = summary_table(rows)
    left_out = "".join(f"\nleft out of the plot: {line}" for line in skipped)
    return out, {"summary": table + left_out, "points": len(curve.points), "runs": len(run_ids)}


def register_finetuned(ctx: StageContext, result: dict[str, Any], value: Any = None) -> None:
    """Report the registration of a fine-tuning (when `tracking.register_model` names one).

    A `FinetuneResult` (`value`) was registered by `run_finetune` itself, from this stage's
    run (its best seed's classifier folder, `tibnlp.training.registration`): copied into the
    report here. A stage function that returns no seeds has its model folder registered as it
    is, with the result's test metrics.
    """
    from tibnlp.training.registration import MODEL_ABOUT

    name = ctx.config.tracking.register_model
    if not name or result.get("registered_model"):
        return
    if getattr(value, "seeds", None):  # run_finetune decided (one place for both callers)
        if getattr(value, "registered_model", ""):
            result["registered_model"] = value.registered_model
            result["registered_seed"] = value.registered_seed
        return
    model_dir = Path(result.get("model_dir") or Path(ctx.config.finetune.output))
    if not model_dir.is_dir():
        return
    metrics = {
        k: float(v)
        for k, v in result.items()
        if k.startswith("test") and isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    what = f"{model_dir.name}, stage {ctx.name} (run {ctx.tracker.run_id})"
    ctx.tracker.register_model(
        model_dir,
        name,
        metrics,
        description=what,
        model_description=MODEL_ABOUT.format(name=name),
    )
    result["registered_model"] = name
