"""Plan and run a pipeline: resolve each node's config and inputs, skip what is cached, run the
rest under one MLflow parent run with a nested run per stage."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tibnlp.config import Config, from_dict, to_dict
from tibnlp.config.core import deep_merge, flatten
from tibnlp.config.identity import output_settings
from tibnlp.data.datadir import require
from tibnlp.errors import ConfigError, TibnlpError
from tibnlp.folder_lock import hold_folder, holder_of
from tibnlp.fsutil import atomic_write_text, blocking_file
from tibnlp.pipeline.cache import Slot, cached_elsewhere, explain_change, node_key, slot_for
from tibnlp.pipeline.context import StageContext
from tibnlp.pipeline.grid import Node, expand
from tibnlp.pipeline.launch import launch_stage
from tibnlp.pipeline.registry import stage_def
from tibnlp.pipeline.spec import PARAMS, PipelineSpec, get_dotted, has_dotted, substitute
from tibnlp.tracking import Tracker, path_hash, provenance_tags
from tibnlp.tracking.conventions import TAG_MODEL, TAG_STAGE, TAG_VARIANT, config_hash

DATA_PREFIX = "data:"
SUMMARY = "summary"  # a stage result's text shown when the pipeline ends
NOTE = "mlflow.note.content"  # MLflow's description of a run or an experiment


@dataclass
class Step:
    """One node of the plan."""

    node: Node
    key: str
    slot: Slot
    action: Literal["run", "skip"]
    reason: str
    config: dict[str, Any]  # resolved config dict (stage outputs as `stage:KEY`)
    inputs: Any  # inputs as hashed (data by content hash, stages by key)
    manifest: dict[str, Any] | None = None
    data: dict[str, str] = field(default_factory=dict)  # files read by name (StageDef.data)


@dataclass
class PipelineRun:
    steps: list[Step]
    ran: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    outputs: dict[str, Path] = field(default_factory=dict)
    results: dict[str, Any] = field(default_factory=dict)
    run_id: str | None = None


def _set_dotted(data: dict[str, Any], key: str, value: Any, where: str) -> None:
    """Set `key` in `data`; a mapping given for a section sets those keys in it, as `--set`
    does (a variant's `set: {vocab: {seed: 1}}` keeps the stage's other vocab keys)."""
    node = data
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{where}: '{key}' sets inside a value, not a section")
    if isinstance(value, dict) and isinstance(node.get(parts[-1]), dict):
        node[parts[-1]] = deep_merge(node[parts[-1]], value)
    else:
        node[parts[-1]] = copy.deepcopy(value)


def _filled(fills: Iterable[tuple[str, str]], inputs: Any) -> list[str]:
    """The config keys the stage sets itself here (`StageDef.fills`: from an input the node
    has, or to its output folder): whatever the file says for them never reaches the stage,
    so they are pinned in its key (`output_settings`), or an output path would rerun it."""
    names = set(inputs) if isinstance(inputs, dict) else set()
    return [key for key, source in fills if not source or source in names]


class Planner:
    """Resolves nodes to configs, inputs and content keys."""

    def __init__(self, spec: PipelineSpec, workdir: Path | None = None) -> None:
        self.spec = spec
        self.workdir = Path(workdir or spec.workdir)
        self.keys: dict[int, str] = {}
        self.outputs: dict[int, Path] = {}
        self.left_out: list[Node] = []  # nodes that `until` does not need

    def data_path(self, text: str, where: str) -> Path:
        rel = text[len(DATA_PREFIX) :].strip().lstrip("/")
        if not rel:
            raise ConfigError(f"{where}: '{text}' names no file (data:FOLDER/FILE)")
        return require(rel, f"{where}: {text}")

    def _lookup(self, node: Node, real: bool) -> Callable[[str, str], Any]:
        def lookup(ref: str, where: str) -> Any:
            parts = ref.split(".")
            if parts[0] != "stages" or len(parts) != 3 or parts[2] != "output":
                raise ConfigError(
                    f"{self.spec.source}: {where}: unknown reference ${{{ref}}}",
                    "references are ${vars.NAME} and ${stages.STAGE.output}",
                )
            if parts[1] in node.collected:  # a collect stage: every node of that stage
                return [self._ref(up, real) for up in node.collected[parts[1]]]
            return self._ref(node.upstream[parts[1]], real)

        return lookup

    def _ref(self, up: Node, real: bool) -> str:
        return str(self.outputs[id(up)]) if real else f"stage:{self.keys[id(up)]}"

    def params(self, node: Node, real: bool) -> dict[str, Any]:
        """The stage's params, with what its variant sets under `params.` (a grid over
        params: each value its own node, cached separately)."""
        params = copy.deepcopy(node.stage.params)
        for key, value in node.overrides.items():
            if key.startswith(PARAMS):
                _set_dotted(params, key[len(PARAMS) :], value, f"stages.{node.stage.name}")
        return dict(substitute(params, self._lookup(node, real), "params"))

    def _data(self, value: Any, real: bool, where: str) -> Any:
        if isinstance(value, str) and value.startswith(DATA_PREFIX):
            path = self.data_path(value, where)
            return str(path) if real else f"{value}@{path_hash(path)}"
        if isinstance(value, dict):
            return {k: self._data(v, real, f"{where}.{k}") for k, v in value.items()}
        if isinstance(value, list):
            return [self._data(v, real, f"{where}[{i}]") for i, v in enumerate(value)]
        return value

    def _anchored(self, value: Any) -> Any:
        """Relative plain paths made absolute: they count from the working directory, where
        the command runs (as --workdir does), and the file the plan hashes is the one the stage
        reads whatever directory it runs in."""
        if isinstance(value, dict):
            return {k: self._anchored(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._anchored(v) for v in value]
        if (
            isinstance(value, str)
            and value.strip()
            and "${" not in value
            and not value.startswith(DATA_PREFIX)
            and not Path(value).is_absolute()
        ):
            return str(Path(value).absolute())
        return value

    def _inputs(self, node: Node, real: bool) -> Any:
        where = f"stages.{node.stage.name}.inputs"
        raw = substitute(self._anchored(node.stage.inputs), self._lookup(node, real), where)
        if isinstance(raw, list):  # a collect stage's reference is a list of outputs
            raw = [v for item in raw for v in (item if isinstance(item, list) else [item])]
        out = self._data(raw, real, where)
        if not real:  # plain paths (outside the data directory) count by content
            if isinstance(out, dict):
                return {k: self._plain(v, f"{where}.{k}") for k, v in out.items()}
            return [self._plain(v, f"{where}[{i}]") for i, v in enumerate(out)]
        return out

    def _plain(self, value: Any, where: str) -> Any:
        if not isinstance(value, str):
            raise ConfigError(
                f"{self.spec.source}: {where}: {value!r} is not a path",
                "an input is a path, data:FOLDER/FILE or ${stages.STAGE.output}",
            )
        if value.startswith(("stage:", DATA_PREFIX)):
            return value
        if not value.strip():  # Path("") would be the pipeline's own folder
            raise ConfigError(
                f"{self.spec.source}: {where} is empty",
                "set it (a pipeline variable left empty: --set vars.NAME=PATH)",
            )
        path = Path(value)  # relative ones are anchored in the working directory already
        if not path.exists():
            raise ConfigError(
                f"{self.spec.source}: {where}: {value!r} does not exist",
                "a relative path counts from the working directory; name data files as "
                "data:FOLDER/FILE (inside the data directory)",
            )
        return f"file@{path_hash(path)}"

    def config_dict(self, node: Node, real: bool) -> dict[str, Any]:
        where = f"{self.spec.source}: stages.{node.stage.name}"
        data = deep_merge(self.spec.config, node.stage.config)
        for key, value in node.overrides.items():
            if not key.startswith(PARAMS):
                _set_dotted(data, key, value, where)
        data = substitute(data, self._lookup(node, real), f"stages.{node.stage.name}.config")
        resolved = self._data(data, real, f"stages.{node.stage.name}.config")
        try:
            return to_dict(from_dict(Config, resolved))  # typed, validated, defaults filled
        except ConfigError as exc:
            raise ConfigError(
                f"{self._origin(node, exc.message)}: {exc.message}", exc.hint
            ) from exc

    def _origin(self, node: Node, message: str) -> str:
        """Where the key a validation error names was set: a stage's config, a variant, the
        shared `config:` section (through a `${vars.X}` or not), or `--set`. The shared
        section is merged into every stage, so the first stage checked is not the place."""
        return f"{self.spec.source}: {self._place(node, message)}"

    def _place(self, node: Node, message: str) -> str:
        stage = f"stages.{node.stage.name}"
        found = re.search(r"config key '([^']+)'", message)
        key = found.group(1) if found else ""
        if not key:
            return stage + (f" [{node.variant}]" if node.variant else "")
        if key in node.overrides:
            return f"{stage} [{node.variant}]"
        if has_dotted(node.stage.config, key):
            setter = f"{stage}.config.{key}"
            return setter + (" (--set)" if setter in self.spec.set_keys else "")
        if f"config.{key}" in self.spec.set_keys:
            return f"--set {key}"
        raw = get_dotted(self.spec.config_template, key, "")
        refs = sorted(set(re.findall(r"\$\{(vars\.[^}]+)\}", str(raw))))
        if refs:
            given = [f"--set {r}" if r in self.spec.set_keys else r for r in refs]
            return f"config.{key} = {raw} ({', '.join(given)})"
        if has_dotted(self.spec.config, key):
            return f"config.{key}"
        return stage + (f" [{node.variant}]" if node.variant else "")

    def needed(self, nodes: list[Node], until: Iterable[str]) -> set[int] | None:
        """The nodes of the stages in `until` and every node they read, transitively
        (None: no `until`, every node)."""
        targets = set(until)
        if not targets:
            return None
        names = [st.name for st in self.spec.stages]
        unknown = sorted(targets - set(names))
        if unknown:
            raise ConfigError(
                f"{self.spec.source}: --until {', '.join(unknown)}: the pipeline has no such stage",
                f"its stages: {', '.join(names)}",
            )
        keep: set[int] = set()
        todo = [n for n in nodes if n.stage.name in targets]
        while todo:
            node = todo.pop()
            if id(node) not in keep:
                keep.add(id(node))
                todo.extend(node.reads())
        return keep

    def plan(self, force: Iterable[str] = (), until: Iterable[str] = ()) -> list[Step]:
        """The steps to take, in order; with `until`, only those its stages need."""
        forced = set(force)
        steps: list[Step] = []
        stale: set[int] = set()
        every = expand(self.spec)
        unknown = sorted(forced - {n.stage.name for n in every} - {n.name for n in every})
        if unknown:
            raise ConfigError(
                f"{self.spec.source}: --force {', '.join(unknown)}: the pipeline has no such "
                "stage or stage run",
                f"its stages: {', '.join(st.name for st in self.spec.stages)}",
            )
        keep = self.needed(every, until)
        nodes = [n for n in every if keep is None or id(n) in keep]
        self.left_out = [n for n in every if keep is not None and id(n) not in keep]
        for node in nodes:
            try:
                sdef = stage_def(node.stage.kind)
            except ConfigError as exc:
                where = f"{self.spec.source}: stages.{node.stage.name}.kind"
                raise ConfigError(f"{where}: {exc.message}", exc.hint) from exc
            config = self.config_dict(node, real=False)
            inputs = self._inputs(node, real=False)
            sections = output_settings(config, sdef.sections, _filled(sdef.fills, inputs))
            params = self.params(node, real=False)
            reads = sdef.accepts
            if reads is not None and reads.check is not None:
                try:
                    reads.check(params)
                except ConfigError as exc:
                    where = f"{self.spec.source}: stages.{node.name}"
                    raise ConfigError(f"{where}: {exc.message}", exc.hint) from exc
            key = node_key(node.stage.kind, sections, params, inputs)
            data = sdef.data(config) if sdef.data is not None else {}
            described = {**sections, "params": params} if params else sections
            self.keys[id(node)] = key
            slot = slot_for(self.workdir, node.stage.name, node.variant, key)
            manifest = slot.manifest(key)
            action: Literal["run", "skip"]
            upstream_runs = [u.name for u in node.reads() if id(u) in stale]
            if node.stage.name in forced or node.name in forced:
                action, reason = "run", "forced (--force)"
            elif upstream_runs and manifest is not None:  # same key, replaced input
                action, reason = "run", f"{', '.join(upstream_runs)} runs first (new output)"
            elif manifest is not None and (changed := _changed_data(manifest, data)):
                action, reason = "run", f"data changed since it ran: {changed}"
            elif manifest is not None:
                action, reason = "skip", f"cached: same config and inputs ({slot.final})"
                self.outputs[id(node)] = slot.output_of(manifest)
            elif (
                not upstream_runs
                and not slot.partial.exists()
                and (found := cached_elsewhere(slot, key)) is not None
                and not _changed_data(found[1], data)
            ):
                slot, manifest = found
                action = "skip"
                reason = f"cached under another name: same config and inputs ({slot.final})"
                self.outputs[id(node)] = slot.output_of(manifest)
            elif slot.partial.exists():
                action, reason = "run", f"resume the interrupted run in {slot.partial}"
            elif upstream_runs and slot.previous() is not None:
                action, reason = "run", f"input changed: {', '.join(upstream_runs)} runs first"
            else:
                action = "run"
                reason = explain_change(slot.previous(), described, inputs)
            if action == "run":
                stale.add(id(node))
            steps.append(Step(node, key, slot, action, reason, described, inputs, manifest, data))
        return steps


def _changed_data(manifest: dict[str, Any], data: dict[str, str]) -> str:
    """The files read by name whose content differs from when the cached output was made
    (none: ""). A manifest from before they were recorded, or a file absent now, is not
    compared: only a known difference reruns."""
    before = manifest.get("data")
    if not isinstance(before, dict):
        return ""
    changed = sorted(name for name, digest in data.items() if before.get(name, digest) != digest)
    more = f" (+{len(changed) - 3} more)" if len(changed) > 3 else ""
    return ", ".join(changed[:3]) + more


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
    )
    parent.log_params({f"vars.{k}": v for k, v in spec.vars.items()})
    parent.set_tags({"tibnlp.pipeline_hash": config_hash(spec.raw), **provenance_tags()})
    parent.log_dict(spec.raw, "pipeline.yaml")
    status = "FAILED"
    running: Step | None = None
    try:
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
                f"{running.slot.partial}; run the same command again to continue from it "
                "(the finished stages stay cached)"
            )
        raise
    finally:
        result.run_id = parent.run_id
        parent.end(status)
    return result


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
    from tibnlp.evaluation.report import load_results, summary_table

    names = [
        name
        for name, res in result.results.items()
        if isinstance(res, dict) and {"system", "dataset", "test_macro_f1"} <= res.keys()
    ]
    if not names:
        return []
    try:
        rows = load_results([result.outputs[name] for name in names])
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
    inputs = planner._inputs(node, real=True)
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
    resume = slot.partial.exists()
    run_file = slot.partial / ".tibnlp-run.json"
    try:
        earlier = json.loads(run_file.read_text(encoding="utf-8")).get("run_id")
    except (OSError, ValueError, AttributeError):  # none, or cut short: a new run
        earlier = None
    child = parent.child(node.name, tags=tags, resume_run_id=earlier)  # resumed: same run
    if earlier:
        child.set_tags({**tags, "mlflow.parentRunId": parent.run_id or ""})
    cfg.tracking.experiment = experiment
    cfg.tracking.uri = parent.uri if parent.enabled else cfg.tracking.uri
    cfg.tracking.enabled = parent.enabled
    cfg.tracking.parent_run_id = parent.run_id or ""
    cfg.tracking.run_id = child.run_id or ""
    cfg.tracking.tags = {**cfg.tracking.tags, **tags}
    slot.partial.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_file, json.dumps({"run_id": child.run_id}))
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
                json.dumps(value, indent=1, ensure_ascii=False, default=str), encoding="utf-8"
            )
            child.log_artifact(slot.partial / "results.json")
        slot.publish(
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
                "run_id": child.run_id,
            }
        )
        status = "FINISHED"
        return slot.output_of({"output_rel": output_rel}), res
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        child.end(status)
