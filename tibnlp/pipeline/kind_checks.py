"""A pipeline stage checked against its kind's declaration (`Accepts`, from the registry):
the kind exists, and the stage gives it the inputs and params it reads, so a `--dry-run`
catches a misspelt or missing input name. Apart from `spec`, which parses the file's own
grammar and knows no stage kind.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tibnlp.errors import ConfigError
from tibnlp.pipeline.context import Accepts
from tibnlp.pipeline.registry import stage_def
from tibnlp.pipeline.variants import PARAMS

if TYPE_CHECKING:
    from tibnlp.pipeline.spec import StageSpec


def check_reads(spec: StageSpec, at: str, explicit_kind: bool) -> None:
    """The stage's kind exists and is given the inputs and params it declares."""
    try:
        reads = stage_def(spec.kind).accepts
    except ConfigError as exc:
        if explicit_kind:
            raise ConfigError(f"{at}.kind: {exc.message}", exc.hint) from exc
        raise ConfigError(
            f"{at}: {exc.message} (without `kind:`, a stage's kind is its name)", exc.hint
        ) from exc
    if reads is not None:
        _check_inputs(spec, reads, at)
        _check_params(spec, reads, at)


def _check_inputs(spec: StageSpec, reads: Accepts, at: str) -> None:
    kind = f"stage kind {spec.kind}"
    hint = f"{kind} reads: {reads.inputs_text()}"
    given = spec.inputs
    if reads.files:
        if not given:
            raise ConfigError(f"{at}.inputs: {kind} needs at least one input", hint)
        return
    if isinstance(given, list) and given:
        raise ConfigError(f"{at}.inputs: {kind} reads named inputs, not a list", hint)
    names = [str(k) for k in given] if isinstance(given, dict) else []
    for name in names:
        if name not in (*reads.needs, *reads.may):
            raise ConfigError(f"{at}.inputs.{name}: {kind} reads no input named {name!r}", hint)
    for name in reads.needs:
        if name not in names:
            raise ConfigError(
                f"{at}.inputs: {kind} needs an input named {name!r}",
                f"{hint} (e.g. inputs: {{{name}: ${{stages.STAGE.output}}}})",
            )


def _check_params(spec: StageSpec, reads: Accepts, at: str) -> None:
    named = [(f"{at}.params.{k}", str(k)) for k in spec.params]
    named += [
        (f"{at}: variant {v.name} sets {key}", key[len(PARAMS) :].split(".")[0])
        for v in spec.variants
        for key in v.overrides
        if key.startswith(PARAMS)
    ]
    for where, name in named:
        if name not in reads.params:
            raise ConfigError(
                f"{where}: stage kind {spec.kind} takes no param {name!r}",
                f"its params: {', '.join(reads.params)}"
                if reads.params
                else f"stage kind {spec.kind} takes no params: remove it",
            )
