"""From stages to runnable nodes: each stage's variants times the variants of what it reads.

A stage that reads a gridded stage fans out over it: `finetune` reading `pretrain` with ten
variants becomes ten nodes (times its own grid). Each node knows which upstream node feeds
each `${stages.X...}` reference, its config overrides, and the label of the model it stands
for (used to group runs in `tibnlp runs compare`). A `collect` stage does not fan out: its one
node reads every node of the stages it references (a plot or a table over the grid).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from tibnlp.errors import ConfigError
from tibnlp.pipeline.spec import PipelineSpec, StageSpec


@dataclass
class Node:
    stage: StageSpec
    variant: str  # "" for a stage without variants; "a,b" joins upstream and own names
    overrides: dict[str, Any]  # this node's own variant overrides (dotted keys)
    upstream: dict[str, Node] = field(default_factory=dict)  # stage name -> node it reads
    model_label: str = ""
    collected: dict[str, list[Node]] = field(default_factory=dict)  # collect: all nodes read
    own: str = ""  # this node's own variant name
    # stage name -> the node of that stage this one descends from (itself included)
    lineage: dict[str, Node] = field(default_factory=dict)

    def reads(self) -> list[Node]:
        """Every node this one reads."""
        return [*self.upstream.values(), *(n for ns in self.collected.values() for n in ns)]

    @property
    def name(self) -> str:
        return f"{self.stage.name}[{self.variant}]" if self.variant else self.stage.name


def _touches_model(overrides: dict[str, Any]) -> bool:
    return any(k.startswith("model.") for k in overrides)


def expand(spec: PipelineSpec) -> list[Node]:
    """All nodes in a valid run order (upstream before downstream)."""
    by_stage: dict[str, list[Node]] = {}
    order: list[Node] = []
    for stage in spec.stages:
        refs = stage.references()
        choices = [by_stage[r] for r in refs]
        nodes = []
        if stage.collect:
            collected = {r: by_stage[r] for r in refs}
            for variant in stage.variants:
                node = Node(stage, variant.name, dict(variant.overrides), collected=collected)
                node.own, node.lineage = variant.name, {stage.name: node}
                nodes.append(node)
            by_stage[stage.name] = nodes
            order += nodes
            continue
        for combo in itertools.product(*choices) if refs else [()]:
            # two inputs descending from one gridded stage must descend from the same variant
            # of it (prepare[a] -> vocab[a]: pretrain reads prepare[a] with vocab[a] only)
            lineage: dict[str, Node] = {}
            if any(
                lineage.setdefault(name, anc) is not anc
                for up in combo
                for name, anc in up.lineage.items()
            ):
                continue
            upstream = dict(zip(refs, combo, strict=True))
            inherited = [n.own for n in lineage.values() if n.own]
            inherited_model = [
                n.own
                for n in lineage.values()
                if n.own and not n.stage.collect and _touches_model(n.overrides)
            ]
            for variant in stage.variants:
                label = ",".join(p for p in [*inherited, variant.name] if p)
                model = ",".join(inherited_model)
                if variant.name and _touches_model(variant.overrides):
                    model = ",".join(p for p in [model, variant.name] if p)
                node = Node(stage, label, dict(variant.overrides), upstream, model)
                node.own, node.lineage = variant.name, {**lineage, stage.name: node}
                nodes.append(node)
        by_stage[stage.name] = nodes
        order += nodes
    # names joined across stages ("a,b" + "c", "a" + "b,c") can meet: a node name is its
    # MLflow run, its result and its --force handle, so two of one name are refused
    names: set[str] = set()
    for node in order:
        if node.name in names:
            raise ConfigError(
                f"{spec.source or 'pipeline'}: stages.{node.stage.name}: two runs are named "
                f"{node.name}",
                "give the variants names that stay apart when joined with the names of the "
                "variants above (no commas in variant names)",
            )
        names.add(node.name)
    return order
