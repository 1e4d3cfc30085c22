"""Plan a pipeline: resolve each node's config and inputs to a content key, and decide what
is cached (skip) and what runs, saying why."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tibnlp.config import Config, from_dict, to_dict
from tibnlp.config.core import deep_merge
from tibnlp.config.identity import output_settings
from tibnlp.data.datadir import require
from tibnlp.errors import ConfigError
from tibnlp.pipeline.cache import (
    Slot,
    cached_elsewhere,
    explain_change,
    node_key,
    publication,
    slot_for,
)
from tibnlp.pipeline.freshness import asked_sets, changed_data, keyed_with_sets, unscored
from tibnlp.pipeline.grid import Node, expand
from tibnlp.pipeline.keys import get_dotted, has_dotted, set_dotted
from tibnlp.pipeline.registry import stage_def
from tibnlp.pipeline.spec import PipelineSpec, substitute
from tibnlp.pipeline.stage_refs import READABLE, stage_ref
from tibnlp.pipeline.variants import PARAMS
from tibnlp.tracking import path_hash

DATA_PREFIX = "data:"


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
    scored: dict[str, list[str]] = field(default_factory=dict)  # extra sets asked (`freshness`)
    rescore: bool = False  # runs on its published output, to score extra sets only


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
        self.published: dict[int, str | None] = {}  # node -> publication of its output read
        self.finished: dict[int, Any] = {}  # node -> when that publication finished
        self.stale: set[int] = set()  # nodes the plan runs (their output is replaced)

    def data_path(self, text: str, where: str) -> Path:
        rel = text[len(DATA_PREFIX) :].strip().lstrip("/")
        if not rel:
            raise ConfigError(
                f"{where}: '{text}' names no file (data:FOLDER/FILE)",
                "name a file inside the data directory, e.g. data:tncc/tncc_title_train.jsonl "
                "(`tibnlp data list` shows its folders)",
            )
        return require(rel, f"{where}: {text}")

    def _lookup(self, node: Node, real: bool) -> Callable[[str, str], Any]:
        def lookup(ref: str, where: str) -> Any:
            name = stage_ref(ref)
            if name is None:
                raise ConfigError(
                    f"{self.spec.source}: {where}: unknown reference ${{{ref}}}",
                    READABLE,
                )
            if name in node.collected:  # a collect stage: every node of that stage
                return [self._ref(up, real) for up in node.collected[name]]
            return self._ref(node.upstream[name], real)

        return lookup

    def _ref(self, up: Node, real: bool) -> str:
        return str(self.outputs[id(up)]) if real else f"stage:{self.keys[id(up)]}"

    def params(self, node: Node, real: bool) -> dict[str, Any]:
        """The stage's params, with what its variant sets under `params.` (a grid over
        params: each value its own node, cached separately)."""
        params = copy.deepcopy(node.stage.params)
        for key, value in node.overrides.items():
            if key.startswith(PARAMS):
                set_dotted(params, key[len(PARAMS) :], value, f"stages.{node.stage.name}")
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

    def inputs(self, node: Node, real: bool) -> Any:
        """The stage's inputs: with `real`, the paths it reads (an upstream stage's output
        folder); else as its key hashes them (files by content, upstream stages by key)."""
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
                set_dotted(data, key, value, where)
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

    def publications(self, node: Node) -> dict[str, str | None]:
        """Which publication of each upstream output the node reads, as far as known (cached,
        or run in this invocation). A stage's manifest and its partial's run file keep it: a
        forced or data-changed rerun republishes under the same key, which the inputs (keys)
        do not show."""
        return {u.name: self.published[id(u)] for u in node.reads() if id(u) in self.published}

    def republished(self, record: Any, node: Node, since: Any = None) -> list[str]:
        """The upstream nodes published anew since `record` (the `upstream` of a manifest or a
        run file) was written. A manifest from before these records were kept is judged by
        times: an upstream that finished after it (`since`, its "finished") was published
        since; the same second is not (an existing cache stays valid, and the first
        interrupted `--force` after an upgrade does not leave the results of a replaced model
        cached)."""
        if not isinstance(record, dict):
            if not isinstance(since, str):
                return []
            return [
                u.name
                for u in node.reads()
                if isinstance(done := self.finished.get(id(u)), str) and done > since
            ]
        now = self.publications(node)
        return [name for name, pub in now.items() if name in record and record[name] != pub]

    def note_published(self, node: Node, manifest: dict[str, Any]) -> None:
        """The publication of `node`'s output its readers read (and when it finished)."""
        self.published[id(node)] = publication(manifest)
        self.finished[id(node)] = manifest.get("finished")

    def resumable(self, node: Node, slot: Slot) -> bool:
        """Whether the node's partial output was made from the upstream outputs it reads now:
        one made from an output since replaced is restarted, never resumed onto the new one."""
        reads = node.reads()
        if any(id(u) in self.stale and id(u) not in self.published for u in reads):
            return False  # an upstream runs first: whatever the partial read is replaced
        record = slot.run_record().get("upstream")
        if not isinstance(record, dict):  # from before the record: only this run's are known
            return not any(id(u) in self.stale for u in reads)
        return not self.republished(record, node)

    def resuming(self, node: Node, slot: Slot) -> str:
        """A run's reason's note that it resumes an interrupted one (none: ""): a rerun of a
        published output goes on from the partial, not from the start or the output."""
        if slot.partial.exists() and self.resumable(node, slot):
            return f" (resume the interrupted run in {slot.partial})"
        return ""

    def plan(self, force: Iterable[str] = (), until: Iterable[str] = ()) -> list[Step]:
        """The steps to take, in order; with `until`, only those its stages need."""
        forced = set(force)
        steps: list[Step] = []
        stale = self.stale = set()
        self.published, self.finished = {}, {}
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
            inputs = self.inputs(node, real=False)
            pinned = [*_filled(sdef.fills, inputs), *sdef.rescored]
            sections = output_settings(config, sdef.sections, pinned)
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
            slot = slot_for(self.workdir, node.stage.name, node.variant, key)
            manifest = slot.manifest(key)
            action: Literal["run", "skip"]
            scored, more = asked_sets(config, sdef.rescored), []
            if manifest is None and sdef.rescored and not slot.partial.exists():
                held = output_settings(config, sdef.sections, _filled(sdef.fills, inputs))
                old_key = node_key(node.stage.kind, held, params, inputs)
                old_slot = slot_for(self.workdir, node.stage.name, node.variant, old_key)
                if (found := keyed_with_sets(old_slot, old_key, scored)) is not None:
                    key, (slot, manifest) = old_key, found
            self.keys[id(node)] = key
            upstream_runs = [u.name for u in node.reads() if id(u) in stale]
            if node.stage.name in forced or node.name in forced:
                action, reason = "run", "forced (--force)"
            elif upstream_runs and manifest is not None:  # same key, replaced input
                action, reason = "run", f"{', '.join(upstream_runs)} runs first (new output)"
            elif manifest is not None and (changed := changed_data(manifest, data)):
                action, reason = "run", f"data changed since it ran: {changed}"
            elif manifest is not None and (more := unscored(manifest, scored)):
                action, reason = "run", f"rescore only: {', '.join(more)} newly asked"
                reason += self.resuming(node, slot)
            elif manifest is not None and (
                moved := self.republished(manifest.get("upstream"), node, manifest.get("finished"))
            ):
                action, reason = "run", f"{', '.join(moved)} republished since this ran"
                reason += self.resuming(node, slot)
            elif manifest is not None:
                action, reason = "skip", f"cached: same config and inputs ({slot.final})"
                self.outputs[id(node)] = slot.output_of(manifest)
                self.note_published(node, manifest)
            elif (
                not upstream_runs
                and not slot.partial.exists()
                and (found := cached_elsewhere(slot, key)) is not None
                and not changed_data(found[1], data)
                and not unscored(found[1], scored)
                and not self.republished(found[1].get("upstream"), node, found[1].get("finished"))
            ):
                slot, manifest = found
                action = "skip"
                reason = f"cached under another name: same config and inputs ({slot.final})"
                self.outputs[id(node)] = slot.output_of(manifest)
                self.note_published(node, manifest)
            elif slot.partial.exists() and self.resumable(node, slot):
                action, reason = "run", f"resume the interrupted run in {slot.partial}"
            elif slot.partial.exists():
                action = "run"
                reason = f"restart the interrupted run in {slot.partial} (it read an older input)"
            elif upstream_runs and slot.previous() is not None:
                action, reason = "run", f"input changed: {', '.join(upstream_runs)} runs first"
            else:
                action = "run"
                reason = explain_change(slot.previous(), described, inputs)
            if action == "run":
                stale.add(id(node))
            step = Step(node, key, slot, action, reason, described, inputs, manifest, data, scored)
            steps.append(step)
            step.rescore = bool(more) and action == "run"
        return steps
