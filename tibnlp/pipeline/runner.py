"""Run a pipeline: the plan (`tibnlp.pipeline.planner`: each node's config, inputs and key,
what is cached) is carried out, the cached nodes skipped, the rest run under one MLflow parent
run with a nested run per stage."""

from __future__ import annotations

import json
import shlex
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tibnlp.config import Config, from_dict, to_dict
from tibnlp.config.core import flatten
from tibnlp.errors import ConfigError, TibnlpError
from tibnlp.folder_lock import hold_folder, holder_of
from tibnlp.fsutil import atomic_write_text, blocking_file
from tibnlp.pipeline.context import StageContext
from tibnlp.pipeline.freshness import reuse_output, scored_now
from tibnlp.pipeline.launch import launch_stage
from tibnlp.pipeline.planner import Planner, Step
from tibnlp.pipeline.registry import stage_def
from tibnlp.pipeline.spec import PipelineSpec
from tibnlp.standard_json import dumps
from tibnlp.tracking import Tracker, provenance_tags
from tibnlp.tracking.conventions import TAG_MODEL, TAG_STAGE, TAG_VARIANT, config_hash
from tibnlp.tracking.orphans import close_run, end_orphans, open_run
from tibnlp.tracking.store_errors import URI_KEY, URI_OPTION

SUMMARY = "summary"  # a stage result's text shown when the pipeline ends
NOTE = "mlflow.note.content"  # MLflow's description of a run or an experiment


@dataclass
class PipelineRun:
    steps: list[Step]
    ran: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    outputs: dict[str, Path] = field(default_factory=dict)
    results: dict[str, Any] = field(default_factory=dict)
    run_id: str | None = None


def _provenance(inputs: Any) -> dict[str, str]:
    named = inputs if isinstance(inputs, dict) else {}
    data = [Path(v) for k, v in named.items() if k not in ("vocab", "model", "static")]
    if isinstance(inputs, list):
        data = [Path(v) for v in inputs]
    return provenance_tags(
        data=data or None, vocab=named.get("vocab"), parent_model=named.get("model")
    )


def _numbers(result: dict[str, Any]) -> dict[str, float]:
    out = {}
    for k, v in flatten(result).items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = float(v)
    return out


def run_pipeline(
    spec: PipelineSpec,
    dry_run: bool = False,
    force: Iterable[str] = (),
    tracking_uri: str = "",
    echo: Callable[[str], None] = print,
    workdir: Path | None = None,
    wait: bool = False,
    until: Iterable[str] = (),
) -> PipelineRun:
    """Run what is not cached, in order; print the plan first (only the plan with dry_run).
    With `until`, run only those stages and what they read (a make target: e.g. the main
    job without its comparison stages).

    A run holds its work dir (`tibnlp.folder_lock`) from planning to the end: a second run on
    the same folder refuses at once, or with `wait` starts when the first is done (and then
    plans against what the first published).
    """
    planner = Planner(spec, workdir)
    _check_workdir(planner.workdir, "--workdir" if workdir else f"{spec.source}: workdir")
    if dry_run:
        return _plan_and_run(planner, spec, True, force, tracking_uri, echo, until)
    with hold_folder(planner.workdir, wait=wait, notify=echo):
        return _plan_and_run(planner, spec, False, force, tracking_uri, echo, until)


def _check_workdir(path: Path, where: str) -> None:
    """The work dir is created when the run starts: a file in its way (or in the way of a
    folder above it) is refused now, in a --dry-run too, not with a bare FileExistsError."""
    part = blocking_file(path)
    if part is not None:
        what = "is" if part == path else f"is inside {part}, which is"
        raise ConfigError(
            f"{where}: {path} {what} a file, not a folder",
            "give a folder for the stage outputs (it is created if missing)",
        )


def _plan_and_run(
    planner: Planner,
    spec: PipelineSpec,
    dry_run: bool,
    force: Iterable[str],
    tracking_uri: str,
    echo: Callable[[str], None],
    until: Iterable[str] = (),
) -> PipelineRun:
    force = list(force)
    steps = planner.plan(force, until)
    result = PipelineRun(steps)
    width = max(len(n.name) for n in [*(s.node for s in steps), *planner.left_out])
    echo(f"pipeline {spec.name}: {len(steps)} stage runs, work dir {planner.workdir}")
    for note in spec.notes:
        echo(f"  note: {note}")
    busy = holder_of(planner.workdir) if dry_run else ""
    if busy:  # its stage in progress reads "resume the interrupted run" below
        echo(
            f"  note: the work dir is in use by {busy}: a partial output below may be the "
            "stage it is running, not an interrupted one"
        )
    for s in steps:
        echo(f"  {s.action:4}  {s.node.name:{width}}  {s.reason}")
    targets = ", ".join(sorted(set(until)))
    for node in planner.left_out:
        echo(f"  {'left':4}  {node.name:{width}}  not needed by --until {targets}")
    if dry_run:
        return result
    # the lock is held: the process that noted a run is gone (though a launched stage's
    # workers, which no parent-death signal stops, may outlive it for a while)
    end_orphans(planner.workdir, echo)
    if all(s.action == "skip" for s in steps):  # nothing to log: no empty parent run
        for s in steps:
            _record_skip(result, planner, s)
        echo("everything is cached; nothing to run")
        _report(spec, result, echo, None)
        return result
    base_cfg = from_dict(Config, spec.config)
    uri = tracking_uri or base_cfg.tracking.uri
    parent = Tracker(
        spec.experiment,
        spec.name,
        uri=uri,
        enabled=base_cfg.tracking.enabled,
        tags={"tibnlp.pipeline": spec.name},
        buffer_dir=base_cfg.tracking.buffer_dir or None,
        retry_seconds=base_cfg.tracking.retry_seconds,
        uri_setting=URI_OPTION if tracking_uri else URI_KEY,  # (both are pipeline run's)
    )
    status = "FAILED"
    running: Step | None = None
    try:  # (from here on the parent ends, FAILED unless every stage ran)
        if parent.enabled:  # a SIGKILL ends nothing: the next run here ends what it leaves
            open_run(planner.workdir, parent.run_id, parent.uri)
        parent.log_params({f"vars.{k}": v for k, v in spec.vars.items()})
        parent.set_tags({"tibnlp.pipeline_hash": config_hash(spec.raw), **provenance_tags()})
        parent.log_dict(spec.raw, "pipeline.yaml")
        for step in steps:
            node = step.node
            if step.action == "skip":
                _record_skip(result, planner, step)
                continue
            echo(f"[{len(result.ran) + len(result.skipped) + 1}/{len(steps)}] {node.name}")
            running = step
            out, res = _run_step(planner, step, parent, spec.experiment)
            running = None
            planner.outputs[id(node)] = out
            result.outputs[node.name] = out
            result.results[node.name] = res
            result.ran.append(node.name)
        _report(spec, result, echo, parent)
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        # Ctrl-C ends the command without a word otherwise: say what stays and how to go on
        if running is not None:
            echo(
                f"interrupted in stage {running.node.name}: its output so far stays in "
                f"{running.slot.partial}; {_go_on(steps, result.ran, force)}"
            )
        raise
    finally:
        result.run_id = parent.run_id
        parent.end(status)
        close_run(planner.workdir, parent.run_id)
    return result


def _go_on(steps: list[Step], ran: list[str], force: list[str]) -> str:
    """How to continue after an interruption: the same command, less the --force of stages
    it already republished (forced again, they would run from scratch; left out, they are
    cached and the stages reading them rerun)."""
    given = list(dict.fromkeys(force))
    keep: list[str] = []
    for arg in given:
        nodes = [s.node.name for s in steps if arg in (s.node.stage.name, s.node.name)]
        left = [name for name in nodes if name not in ran]
        keep += [arg] if len(left) == len(nodes) else left
    if keep == given:
        return "run the same command again to continue from it (the finished stages stay cached)"
    before = " ".join(f"--force {shlex.quote(arg)}" for arg in given)
    after = " ".join(f"--force {shlex.quote(arg)}" for arg in keep)
    how = f"with {after} in place of {before}" if keep else f"without {before}"
    return (
        f"run the same command {how} to continue from it (the stages it republished stay "
        "cached: forced again, they would run from scratch)"
    )


def describe(spec: PipelineSpec) -> str:
    """What the pipeline is, for its MLflow experiment's description: the file's
    `description` (or its name) and its stages."""
    head = str(spec.raw.get("description") or f"tibnlp pipeline {spec.name}").strip()
    where = f" ({spec.source.name})" if spec.source else ""
    stages = [
        f"- {st.name} ({st.kind}"
        + (f", {len(st.variants)} variants" if len(st.variants) > 1 else "")
        + (", over every variant above" if st.collect else "")
        + ")"
        + (f": {st.description}" if st.description else "")
        for st in spec.stages
    ]
    return f"{head}{where}\n\nStages:\n" + "\n".join(stages)


def _report(
    spec: PipelineSpec, result: PipelineRun, echo: Callable[[str], None], parent: Tracker | None
) -> None:
    """End by showing what the pipeline produced: each stage result's `summary` (e.g. the
    result table) and where that stage's output is; the same text becomes the parent run's
    description, and the experiment's description says what the pipeline is."""
    parts = []
    for name, res in result.results.items():
        if isinstance(res, dict) and isinstance(res.get(SUMMARY), str):
            parts.append(f"{res[SUMMARY].rstrip()}\n\n{name}: {result.outputs[name]}")
    if not parts:  # no stage wrote a summary: the fine-tuning stages' result table
        parts = _finetune_table(result)
    for text in parts:
        echo("")
        echo(text)
    if parent is not None and parent.enabled:
        if parts:
            parent.set_tags({NOTE: "\n\n".join(parts)})
        parent.set_experiment_tags({NOTE: describe(spec)})


def _finetune_table(result: PipelineRun) -> list[str]:
    from tibnlp.evaluation.report import STAGE_RUN, summary_table
    from tibnlp.evaluation.result_loader import load_results

    names = [
        name
        for name, res in result.results.items()
        if isinstance(res, dict) and {"system", "dataset", "test_macro_f1"} <= res.keys()
    ]
    if not names:
        return []
    rows: list[dict[str, Any]] = []
    seen: set[Path] = set()  # two runs cached in one folder: one row
    try:
        for name in names:  # each row named by its run: the variants of a grid look alike
            if (out := result.outputs[name].resolve()) not in seen:
                seen.add(out)
                rows += [{**row, STAGE_RUN: name} for row in load_results([out])]
    except TibnlpError:
        return []
    where = "\n".join(f"{name}: {result.outputs[name]}" for name in names)
    return [f"{summary_table(rows).rstrip()}\n\n{where}"] if rows else []


def _record_skip(result: PipelineRun, planner: Planner, step: Step) -> None:
    result.skipped.append(step.node.name)
    result.outputs[step.node.name] = planner.outputs[id(step.node)]
    result.results[step.node.name] = (step.manifest or {}).get("result")


def _run_step(planner: Planner, step: Step, parent: Tracker, experiment: str) -> tuple[Path, Any]:
    node, slot = step.node, step.slot
    config_data = planner.config_dict(node, real=True)
    cfg = from_dict(Config, config_data)
    inputs = planner.inputs(node, real=True)
    paths: list[Path] | dict[str, Path] = (
        {k: Path(v) for k, v in inputs.items()}
        if isinstance(inputs, dict)
        else [Path(v) for v in inputs]
    )
    tags = {TAG_STAGE: node.stage.name}
    if node.variant:
        tags[TAG_VARIANT] = node.variant
    if node.model_label:
        tags[TAG_MODEL] = node.model_label
    resume = slot.partial.exists() and planner.resumable(node, slot)
    if slot.partial.exists() and not resume:  # made from an upstream output since replaced
        shutil.rmtree(slot.partial)
    earlier = slot.run_record().get("run_id")  # none, or cut short: a new run
    child = parent.child(node.name, tags=tags, resume_run_id=earlier)  # resumed: same run
    if earlier:
        child.set_tags({**tags, "mlflow.parentRunId": parent.run_id or ""})
    cfg.tracking.experiment = experiment
    cfg.tracking.uri = parent.uri if parent.enabled else cfg.tracking.uri
    cfg.tracking.enabled = parent.enabled
    cfg.tracking.parent_run_id = parent.run_id or ""
    cfg.tracking.run_id = child.run_id or ""
    cfg.tracking.tags = {**cfg.tracking.tags, **tags}
    if step.rescore and not resume:  # extra sets only: every seed is reported as it was
        reuse_output(slot)
    slot.partial.mkdir(parents=True, exist_ok=True)
    upstream = planner.publications(node)
    atomic_write_text(slot.run_file, json.dumps({"run_id": child.run_id, "upstream": upstream}))
    params = planner.params(node, real=True)
    # Paths left empty here (pretrain.corpus, finetune.model...) are filled from the inputs by
    # the stage adapter, and the stage logs them itself: logging "" now would make MLflow
    # reject that later batch ("changing param values is not allowed").
    settings = flatten({k: v for k, v in to_dict(cfg).items() if k != "tracking"})
    child.log_params({k: v for k, v in settings.items() if v != ""})
    if params:
        child.log_params({"params": params})
    # a collect stage reads other stages' outputs, not data: nothing to hash
    provenance = {} if node.stage.collect else _provenance(paths)
    child.set_tags({**provenance, "tibnlp.stage_key": step.key})
    child.log_dict(to_dict(cfg), "config/resolved.yaml")
    ctx = StageContext(
        node.name, node.stage.name, node.variant, cfg, paths, slot.partial, resume, child, params
    )
    status = "FAILED"
    try:
        if node.stage.launch:
            value = launch_stage(node.stage.launch, node.stage.kind, ctx)
        else:
            value = stage_def(node.stage.kind).load()(ctx)
        output_rel, res = "", None
        if isinstance(value, tuple):  # (output path, report)
            value, res = value
            child.log_metrics(_numbers(res))
        if isinstance(value, (str, Path)):
            produced = Path(value).resolve()
            base = slot.partial.resolve()
            if produced != base and base not in produced.parents:
                raise TibnlpError(
                    f"stage {node.name} returned {produced}, outside its output {slot.partial}",
                    "stage functions must write inside ctx.output",
                )
            output_rel = produced.relative_to(base).as_posix() if produced != base else ""
        elif isinstance(value, dict):
            res = value
            child.log_metrics(_numbers(value))
            (slot.partial / "results.json").write_text(
                dumps(value, indent=1, ensure_ascii=False, default=str), encoding="utf-8"
            )
            child.log_artifact(slot.partial / "results.json")
        manifest = slot.publish(
            {
                "key": step.key,
                "stage": node.stage.name,
                "variant": node.variant,
                "kind": node.stage.kind,
                "output_rel": output_rel,
                "result": res,
                "config": step.config,
                "inputs": step.inputs,
                "data": step.data,
                "scored": scored_now(step.manifest, step.scored, step.rescore),
                "run_id": child.run_id,
                "upstream": upstream,
            }
        )
        planner.note_published(node, manifest)
        status = "FINISHED"
        return slot.output_of({"output_rel": output_rel}), res
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        child.end(status)
