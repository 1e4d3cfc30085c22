"""The pipeline file: stages, their configs, how outputs feed inputs, grids of variants.

```yaml
name: smoke                      # experiment defaults to "pipeline-<name>"
experiment: tibnlp-smoke
workdir: runs/pipelines/smoke    # default runs/pipelines/<name>
vars: {steps: 200}               # referenced as ${vars.steps}; `--set vars.steps=50`
config:                          # Config sections shared by every stage
  engine: {threads: 2}
stages:
  prepare:                       # stage name; kind defaults to the name
    inputs: [data:corpora/tibetan_tibettimes_news.txt.xz]   # data directory, by name
    config: {corpus: {min_syllables: 3}}
  vocab:
    inputs: {corpus: '${stages.prepare.output}'}   # quoted: `{` inside {...} is YAML syntax
  pretrain:
    inputs: {corpus: '${stages.prepare.output}', vocab: '${stages.vocab.output}'}
    config: {pretrain: {max_steps: '${vars.steps}'}}
    launch: torchrun --nproc_per_node 8 -m         # optional: a multi-process launcher
    grid: {model.heads.small: [6, 8]}                  # product of the listed values
    variants: [{name: fixed12, set: {model.heads.small: 12}}]   # or an explicit list
  finetune:
    inputs: {model: '${stages.pretrain.output}'}       # fans out over pretrain's variants
    grid: {params.export_tokens: [1e6, 4e6]}           # grids may set params too
  plot:
    collect: true       # ONE node reading every variant above: ${stages.finetune.output} is
    inputs: ['${stages.finetune.output}']             # the list of all their outputs
```

A stage may only reference stages above it, so the file order is a valid run order; every
`${stages.NAME.output}` is checked when the file loads (`stage_refs`). Each stage's kind
must exist and be given the inputs and params it declares (`kind_checks`), so a `--dry-run`
catches a misspelt or missing input name.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tibnlp.config.core import apply_overrides, key_path
from tibnlp.config.yaml_loader import YES_NO, read_yaml
from tibnlp.errors import ConfigError
from tibnlp.pipeline.keys import file_whole, has_dotted, set_in_variant
from tibnlp.pipeline.kind_checks import check_reads
from tibnlp.pipeline.launch import check_launch
from tibnlp.pipeline.stage_refs import (
    REF,
    check_stage_refs,
    no_stage_refs,
    stage_located,
    stage_ref,
    strings,
)
from tibnlp.pipeline.variants import Variant, expand_variants

TOP_KEYS = {"name", "experiment", "workdir", "vars", "config", "stages", "description"}
STAGE_KEYS = {
    "kind",
    "inputs",
    "config",
    "params",
    "grid",
    "variants",
    "description",
    "launch",
    "collect",
}


@dataclass
class StageSpec:
    name: str
    kind: str
    inputs: list[Any] | dict[str, Any]
    config: dict[str, Any]
    params: dict[str, Any]
    variants: list[Variant]  # [Variant("", {})] when the stage has no grid
    launch: str = ""  # e.g. "torchrun --nproc_per_node 8 -m": run the stage in N processes
    # one node reading every variant of the stages it references (a plot or table over a
    # grid) instead of one node per upstream variant
    collect: bool = False
    description: str = ""

    def references(self) -> list[str]:
        """Names of the stages this one reads (through ${stages.NAME....})."""
        found: list[str] = []
        overrides = [v.overrides for v in self.variants]  # grid and variant values too
        for text in strings([self.inputs, self.config, self.params, overrides]):
            for ref in REF.findall(text):
                name = stage_ref(ref)
                if name is not None and name not in found:
                    found.append(name)
        return found


@dataclass
class PipelineSpec:
    name: str
    experiment: str
    workdir: Path
    config: dict[str, Any]
    stages: list[StageSpec]
    source: Path | None = None
    vars: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # printed above the plan
    set_keys: list[str] = field(default_factory=list)  # `--set` keys, as the file sees them
    config_template: dict[str, Any] = field(default_factory=dict)  # `config:` before ${vars}


def substitute(obj: Any, lookup: Any, where: str) -> Any:
    """Replace `${a.b}` references with `lookup("a.b")`; a whole-string reference keeps type."""
    if isinstance(obj, str):
        whole = REF.fullmatch(obj.strip())
        if whole:
            return lookup(whole.group(1).strip(), where)
        return REF.sub(lambda m: str(lookup(m.group(1).strip(), where)), obj)
    if isinstance(obj, dict):
        return {k: substitute(v, lookup, f"{where}.{k}") for k, v in obj.items()}
    if isinstance(obj, list):
        return [substitute(v, lookup, f"{where}[{i}]") for i, v in enumerate(obj)]
    return obj


def parse_pipeline(data: dict[str, Any], source: Path | None = None) -> PipelineSpec:
    where = str(source) if source else "pipeline"
    unknown = sorted(set(data) - TOP_KEYS, key=str)
    if unknown:
        raise ConfigError(
            f"{where}: unknown top-level key '{unknown[0]}'; allowed: {', '.join(sorted(TOP_KEYS))}"
        )
    for key in ("name", "experiment", "workdir", "description"):
        # str() of a list would name a run "['a']"; Path(5) is a TypeError
        if isinstance(data.get(key), (dict, list, bool)):
            raise ConfigError(f"{where}: '{key}' must be a single value, got {data[key]!r}")
    name = str(data.get("name") or (source.stem if source else "pipeline"))
    if name in (".", "..") or any(sep in name for sep in ("/", "\\")):
        # the default workdir is runs/pipelines/<name>: '../x' would put it elsewhere
        raise ConfigError(
            f"{where}: 'name' {name!r} is not a plain name",
            "give a name without / or \\ (set 'workdir' to choose where the runs go)",
        )
    vars_ = data.get("vars") or {}
    if not isinstance(vars_, dict):
        raise ConfigError(f"{where}: 'vars' must be a mapping")
    resolving: list[str] = []

    def var_lookup(ref: str, at: str) -> Any:
        head, _, var = ref.partition(".")  # all after `vars.`: a variable `a.b` is one name
        if head == "vars":
            if var not in vars_:
                raise ConfigError(f"{where}: {at}: unknown variable ${{{ref}}}")
            if var in resolving:  # a variable may read another, not itself
                cycle = " -> ".join([*resolving[resolving.index(var) :], var])
                raise ConfigError(f"{where}: vars: the variables read each other ({cycle})")
            resolving.append(var)
            value = substitute(vars_[var], var_lookup, f"vars.{var}")
            resolving.pop()
            return value
        if ref == "name":
            return name
        return "${" + ref + "}"  # stage references are resolved when the stage runs

    template = data.get("config") or {}  # before substitution: which keys read a variable
    data = substitute(data, var_lookup, "")
    vars_ = data.get("vars") or {}  # a variable reading another holds its value
    no_stage_refs(data.get("config"), where)
    stages_raw = data.get("stages")
    if not isinstance(stages_raw, dict) or not stages_raw:
        raise ConfigError(f"{where}: 'stages' must be a non-empty mapping of stage name -> spec")
    stages: list[StageSpec] = []
    for sname, body in stages_raw.items():
        at = f"{where}: stages.{sname}"
        if (
            not str(sname).strip()
            or str(sname).startswith(".")
            or any(sep in str(sname) for sep in ("/", "\\"))
        ):  # its outputs go to <workdir>/<name>: '..' would put them (and `clean`) elsewhere
            raise ConfigError(
                f"{where}: stage name {str(sname)!r} is not a plain name",
                "give a name that does not start with '.' and has no / or \\ (e.g. pretrain)",
            )
        body = body or {}
        if not isinstance(body, dict):
            raise ConfigError(f"{at}: expected a mapping")
        bad = sorted(set(body) - STAGE_KEYS, key=str)
        if bad:
            raise ConfigError(
                f"{at}: unknown key '{bad[0]}'; allowed: {', '.join(sorted(STAGE_KEYS))}"
            )
        inputs = body.get("inputs") or []
        if not isinstance(inputs, (list, dict)):
            raise ConfigError(f"{at}.inputs: expected a list or a mapping")
        for key in ("config", "params"):
            if not isinstance(body.get(key) or {}, dict):
                raise ConfigError(f"{at}.{key}: expected a mapping")
        collect = body.get("collect", False)
        collect = YES_NO.get(collect.lower(), collect) if isinstance(collect, str) else collect
        if not isinstance(collect, bool):
            raise ConfigError(f"{at}.collect: expected true or false")
        for key in ("launch", "description"):
            if isinstance(body.get(key), (dict, list, bool)):
                raise ConfigError(f"{at}.{key}: expected a single value, got {body[key]!r}")
        check_launch(str(body.get("launch") or ""), f"{at}.launch")
        spec = StageSpec(
            name=str(sname),
            kind=str(body.get("kind") or sname),
            inputs=inputs,
            config=dict(body.get("config") or {}),
            params=dict(body.get("params") or {}),
            launch=str(body.get("launch") or ""),
            collect=collect,
            description=str(body.get("description") or ""),
            variants=expand_variants(str(sname), body.get("grid"), body.get("variants"), at),
        )
        check_reads(spec, at, explicit_kind="kind" in body)
        above = [s.name for s in stages]
        below = [str(n) for n in stages_raw][len(above) :]
        check_stage_refs(stage_located(spec, f"stages.{sname}"), above, below, where)
        stages.append(spec)
    config = data.get("config") or {}
    if not isinstance(config, dict):
        raise ConfigError(f"{where}: 'config' must be a mapping of config sections")
    return PipelineSpec(
        name=name,
        experiment=str(data.get("experiment") or f"pipeline-{name}"),
        workdir=Path(str(data.get("workdir") or f"runs/pipelines/{name}")),
        config=config,
        stages=stages,
        source=source,
        vars=vars_,
        raw=data,
        config_template=template if isinstance(template, dict) else {},
    )


def load_pipeline(path: Path, overrides: Iterable[str] = ()) -> PipelineSpec:
    """Read a pipeline file; `--set` overrides address its keys (`vars.steps=50`,
    `stages.pretrain.config.pretrain.max_steps=10`, a variant by name or position:
    `stages.pretrain.variants.fixed12.set.model.heads.small=8`) or, for config sections, every
    stage that does not set the key itself (`pretrain.max_steps=10` is
    `config.pretrain.max_steps=10`; `notes` name the stages it does not reach)."""
    data = read_yaml(Path(path))
    fixed = []
    for text in overrides:
        if not text.split("=", 1)[0].strip() or "=" not in text:
            # before the `config.` prefix below, which the error would otherwise quote
            raise ConfigError(
                f"{path}: --set {text!r} must look like section.key=value",
                "e.g. --set pretrain.max_steps=10, --set vars.NAME=VALUE",
            )
        head = text.split("=", 1)[0].split(".", 1)[0].strip()
        fixed.append(text if head in TOP_KEYS else f"config.{text}")
    for text in fixed:
        target = _check_target(data, text, path)
        try:
            if target[:1] == ["stages"] and target[2:3] == ["variants"] and len(target) > 3:
                set_in_variant(data["stages"], target[1], text)  # an item of a list
            else:
                apply_overrides(data, [text], whole=file_whole)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc.message}", exc.hint) from exc
    spec = parse_pipeline(data, Path(path))
    spec.set_keys = [t.split("=", 1)[0].strip() for t in fixed]
    shared = [k.removeprefix("config.") for k in spec.set_keys if k.startswith("config.")]
    spec.notes = shadowed(spec, [k for k in shared if k])
    return spec


def _check_target(data: dict[str, Any], text: str, path: Path) -> list[str]:
    """`--set vars.NAME=...` and `--set stages.NAME....=...` must name a variable or stage of
    the file: a typo would add an unused variable (silently) or a stage with no kind.
    Returns the keys the --set names (`key_path`)."""
    key = text.split("=", 1)[0].strip()
    parts = key_path(data, key.split("."), file_whole)  # a stage `eval.v2` is one part
    if len(parts) < 2 or parts[0] not in ("vars", "stages"):
        return parts
    section = data.get(parts[0])
    names = [str(k) for k in section] if isinstance(section, dict) else []
    if parts[1] in names:
        return parts
    what = "variable" if parts[0] == "vars" else "stage"
    raise ConfigError(
        f"{path}: --set {key}: the pipeline has no {what} named {parts[1]!r}",
        (f"its {what}s: {', '.join(names)}; " if names else f"it has no {what}s; ")
        + f"add one under `{parts[0]}:` in {path}",
    )


def shadowed(spec: PipelineSpec, keys: Iterable[str]) -> list[str]:
    """A shared `--set section.key=...` gives way to a stage's own `config` or variant that sets
    the same key; say so, rather than let a user believe every stage took it."""
    notes = []
    for key in keys:
        for stage in spec.stages:
            own = has_dotted(stage.config, key)
            varied = [v.name for v in stage.variants if key in v.overrides]
            if varied:  # a variant's value wins over every config
                grid = (spec.raw.get("stages", {}).get(stage.name) or {}).get("grid") or {}
                how = f"grid.{key}='[...]'" if key in grid else f"variants.NAME.set.{key}=..."
                notes.append(
                    f"--set {key} does not reach stage {stage.name}: its variants "
                    f"({', '.join(varied)}) set it (for them: --set stages.{stage.name}.{how})"
                )
            elif own:
                notes.append(
                    f"--set {key} does not reach stage {stage.name}: its own config sets it "
                    f"(for that stage: --set stages.{stage.name}.config.{key}=...)"
                )
    return notes
