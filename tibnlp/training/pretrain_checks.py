"""The refusals and notes of a pretraining run: what `run_pretraining` checks before it writes
anything (config.yaml, tokenised data, checkpoints), so that a refused run leaves its folder
as it was, and the notes on settings that did not take effect.

Cut from pretrain.py because checking is one idea and running another: each function here
tests the config against what is on disk (the output folder, a resumed run's saved config,
the tokenised splits) or what the run reached, and raises a `TibnlpError` naming the key and
what to do, or prints a note. The order they run in stays in pretrain.py (`_checked_inputs`):
tests pin which refusal a run with two faults gets.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tibnlp.config import Config, to_dict
from tibnlp.config.train import PretrainConfig
from tibnlp.errors import ConfigError, DataError, TibnlpError
from tibnlp.fsutil import blocking_file
from tibnlp.training import checkpoint

# pretrain settings that decide which weights the model has (the rest may change on --resume)
MODEL_SHAPING = ("objective", "sop", "contrastive", "generator_ratio", "sparse_last_layer")


def note(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def require_inputs_named(p: PretrainConfig, resume: bool, eval_only: bool) -> None:
    """A corpus and a vocabulary to train on; --eval-only's model to score."""
    if not p.corpus or not p.vocab:
        raise ConfigError(
            "config keys 'pretrain.corpus' and 'pretrain.vocab' must name a prepared corpus "
            "and a vocabulary directory",
            "e.g. --set pretrain.corpus=runs/corpus --set pretrain.vocab=runs/vocab",
        )
    if eval_only and (resume or not p.init_from):
        raise ConfigError(
            "--eval-only scores a model: it needs pretrain.init_from and takes no --resume",
            "e.g. --eval-only --set pretrain.init_from=runs/pretrain/model",
        )


def require_folder_path(output: Path) -> None:
    """`pretrain.output` must be a folder, or a path one can be made at: a file there (or
    above it) failed with a FileExistsError traceback from the folder lock."""
    blocker = blocking_file(output)
    if blocker is not None:
        where = "" if blocker == output else f" ({blocker}, above it, is a file)"
        raise ConfigError(
            f"config key 'pretrain.output': {output} is not a folder{where}",
            "set pretrain.output to a folder path (it is made if absent)",
        )


def require_no_earlier_run(output: Path, resume: bool) -> None:
    """A new run in a folder with another run's checkpoints or model would replace them;
    `--resume` needs the checkpoints."""
    checkpoint.require_resumable(output / "checkpoints", resume)
    if not resume and (output / "model").exists():  # its checkpoints deleted to save space
        raise TibnlpError(
            f"{output / 'model'} holds the model of an earlier run; a new run would replace it",
            "set pretrain.output to a new folder, or move that model away first",
        )


def _model_settings(cfg: Config) -> dict[str, Any]:
    """The settings that decide which weights a pretraining run's model has, flattened."""
    from tibnlp.config.core import flatten

    shaping = {f"pretrain.{k}": getattr(cfg.pretrain, k) for k in MODEL_SHAPING}
    return flatten({"model": to_dict(cfg.model)}) | shaping


def require_same_model(output: Path, cfg: Config, say: bool = True) -> None:
    """`--resume` with the model the checkpoints hold: a shape setting changed since would
    fail deep in DeepSpeed's state-dict load, after config.yaml had been rewritten to the new
    shape. A saved config this version cannot read is left to the load itself. The other
    settings changed are listed once (`say`: on the main process)."""
    from tibnlp.config import load_config
    from tibnlp.config.core import flatten

    saved_path = output / "config.yaml"
    try:
        saved = load_config(saved_path)
    except TibnlpError:  # absent or from another version: nothing to compare against
        return
    was, now = _model_settings(saved), _model_settings(cfg)
    changed = [f"{k} {now.get(k)!r} (saved: {v!r})" for k, v in was.items() if v != now.get(k)]
    if changed:
        more = f"; and {len(changed) - 5} more" if len(changed) > 5 else ""
        raise ConfigError(
            f"--resume: the checkpoints in {output} hold another model than this config asks "
            f"for: {'; '.join(changed[:5])}{more}",
            f"resume with the settings in {saved_path}, or set pretrain.output to a new folder",
        )
    if saved.pretrain.batch_size != cfg.pretrain.batch_size:
        # the checkpoint's data position counts global batches of the saved size in an epoch
        # plan built for that size: another size would skip or repeat examples unannounced
        raise ConfigError(
            f"--resume: pretrain.batch_size {cfg.pretrain.batch_size} (saved: "
            f"{saved.pretrain.batch_size}): the checkpoints' place in the data counts batches "
            "of the saved size",
            f"resume with pretrain.batch_size={saved.pretrain.batch_size} (micro_batch_size "
            "may change), or start a new run from this one's model: "
            f"pretrain.init_from={output / 'model'}",
        )
    # the others may change (a longer max_steps, another lr), but not unannounced
    old, new = flatten(to_dict(saved)), flatten(to_dict(cfg))
    other = [
        f"{k} {new[k]!r} (was {v!r})"
        for k, v in old.items()
        if k in new and v != new[k] and not k.startswith("tracking.")
    ]
    if other and say:
        note(
            f"note: --resume continues with settings changed since {saved_path}: "
            + "; ".join(other)
        )


def require_seq_len_fits(p: PretrainConfig, max_len: int) -> None:
    """Before anything is written: the encoder would refuse the sequences."""
    if p.seq_len > max_len:
        raise ConfigError(
            f"config key 'pretrain.seq_len': {p.seq_len} is above model.max_len "
            f"{max_len}" + (f" (of {p.init_from})" if p.init_from else ""),
            "lower pretrain.seq_len or raise model.max_len",
        )


def segment_chain(cfg: Config) -> int:
    """Segments per chain for segment recurrence (MLM over chains of consecutive segments,
    `tibnlp.data.segment_chains`), 0 without it; refused with an objective that does not
    read chains."""
    chain = cfg.pretrain.recurrence_segments if cfg.model.recurrence.enabled else 0
    if cfg.pretrain.contrastive and chain:
        raise ConfigError(
            "pretrain.contrastive does not read segment chains (model.recurrence.mem_len)",
            "set pretrain.contrastive=0 for a recurrent model",
        )
    if cfg.pretrain.objective == "electra" and chain:
        raise ConfigError(
            "pretrain.objective=electra does not read segment chains (model.recurrence.mem_len)",
            "use pretrain.objective=mlm for a recurrent model",
        )
    return chain


def resumed_on_other_data(data_dir: Path, output: Path) -> DataError:
    """`OtherInputsError`'s advice ("choose another output folder or delete it") does not fit
    a resume: deleting the data the checkpoints' data position points into would continue on
    other data."""
    return DataError(
        f"--resume: {data_dir}, the data the checkpoints were trained on, was "
        "tokenised from other inputs than this config names (another corpus, "
        "vocabulary, seq_len, seed, masking or sop setting)",
        f"resume with the data settings in {output / 'config.yaml'}; to train on other "
        f"data, start a new run with pretrain.init_from={output / 'model'}",
    )


def require_enough_examples(
    p: PretrainConfig,
    splits: Any,
    data_dir: Path,
    output: Path,
    eval_only: bool,
    say: bool,
) -> None:
    """A training batch (or, for `--eval-only`, a held-out one) in the tokenised splits; a
    run without a held-out batch goes on, noted (`say`: on the main process)."""
    if not eval_only and len(splits["train"]) < p.batch_size:
        raise DataError(
            f"{output / 'data'}: {len(splits['train'])} training examples, fewer than one batch "
            f"(pretrain.batch_size={p.batch_size})",
            "use a larger corpus or a smaller batch_size",
        )
    enough_heldout = len(splits["heldout"]) >= p.batch_size
    if eval_only and not (p.eval_batches and enough_heldout):
        raise DataError(
            f"{p.corpus}: its held-out split has {len(splits['heldout'])} examples, fewer than "
            f"one batch (pretrain.batch_size={p.batch_size}), or pretrain.eval_batches is 0",
            "lower pretrain.batch_size or prepare with a larger corpus.heldout_fraction",
        )
    if p.eval_batches and not enough_heldout and not eval_only and say:
        # the run went on without any held-out score, the learning check silently off
        note(
            f"note: the held-out split of {data_dir} has {len(splits['heldout'])} examples, "
            f"fewer than one batch (pretrain.batch_size={p.batch_size}): this run logs no "
            "eval/ metrics and has no learning check; lower pretrain.batch_size or prepare "
            "the corpus with a larger corpus.heldout_fraction"
        )


def note_spent(budget: str, step: int, tokens: float, seconds: float) -> None:
    """A resumed run whose time or token budget was spent already took no step."""
    setting = {"time_budget": "pretrain.time_budget (--time-budget)"}
    note(
        f"note: --resume: the run's {budget.replace('_', ' ')} was already "
        f"spent at step {step} ({tokens:g} tokens, {seconds:.0f} s): "
        f"no step to take; raise {setting.get(budget, 'pretrain.max_tokens')} "
        "to train on"
    )


def note_missed_exports(
    targets: Sequence[float], tokens: float, step: int, stopped_by: str
) -> None:
    """`pretrain.export_at_tokens` past where the run stopped: a learning curve's point that
    silently never came."""
    missed = [t for t in targets if t > tokens]
    if missed:
        note(
            f"note: pretrain.export_at_tokens {', '.join(str(int(t)) for t in missed)} not "
            f"reached: the run stopped ({stopped_by}) at step {step} after "
            f"{int(tokens)} training tokens; --resume with a larger pretrain.max_steps "
            "(or budget) to reach them"
        )
