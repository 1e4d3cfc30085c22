"""`run_pretraining`: ALBERT MLM + SOP on the DeepSpeed engine, from a config to a model dir.

What differs from any other training is here (data, model, what is logged); the step, eval,
checkpoint and stop logic is `loop.TrainLoop`. Output layout:

    OUTPUT/config.yaml        the resolved config of the run
    OUTPUT/data/              tokenised SOP examples (built once by rank 0, then cached)
    OUTPUT/data-heldout/      the held-out split alone, tokenised by `--eval-only`
    OUTPUT/eval.json          `--eval-only`'s scores, OUTPUT/eval-config.yaml its config (a
                              training run's config.yaml in the same folder stays as it is)
    OUTPUT/checkpoints/       DeepSpeed checkpoints + `latest` marker (resume point)
    OUTPUT/model/             model.safetensors + model.yaml + vocabulary: `finetune --model`
    OUTPUT/exports/tokens-N/  the same, as it was when N training tokens were reached
                              (`pretrain.export_at_tokens`): the points of a learning curve

Every model directory records in its metadata (`read_extra`) the step, the tokens trained on,
the training seconds, the analytic FLOPs and the hardware, so a curve can be drawn against
tokens, FLOPs or CPU-hours.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tibnlp.config import Config, ModelConfig, dump_yaml, to_dict
from tibnlp.config.train import parse_duration
from tibnlp.data.masking import MlmCollator
from tibnlp.data.pretraining import (
    SPLITS,
    OtherInputsError,
    build_pretraining_dataset,
    length_bucketed_batches,
    load_pretraining_dataset,
    require_documents,
)
from tibnlp.errors import ConfigError, DataError, TibnlpError
from tibnlp.evaluation.word_order import order_accuracies
from tibnlp.folder_lock import hold_folder
from tibnlp.fsutil import atomic_write_text, blocking_file
from tibnlp.models.electra import ElectraForPretraining
from tibnlp.models.io import save_pretrained
from tibnlp.models.pretraining import AlbertForPretraining
from tibnlp.models.summary import electra_flops_per_token, training_flops_per_token
from tibnlp.text.vocab import Vocabulary, copy_vocabulary
from tibnlp.tracking import Tracker, provenance_tags, tracker_from_config
from tibnlp.training import checkpoint
from tibnlp.training.batches import ShardedBatches
from tibnlp.training.engine import (
    World,
    accumulation_steps,
    hardware_name,
    init_distributed,
    planned_world_size,
    shutdown,
    wait_for_main,
)
from tibnlp.training.learning_check import LearningCheck, unigram_accuracy
from tibnlp.training.loop import LoopSettings, Progress, fit
from tibnlp.training.pretrain_init import initial_weights, load_initial, skipgram_start
from tibnlp.training.wiring import Training, start_training

EVAL_SEED_OFFSET = 1_000_003  # held-out masks differ from any training batch's


def resolve_model_config(model: ModelConfig, vocab_size: int, meta: dict[str, Any]) -> ModelConfig:
    """The vocabulary's real size and, for `heads.threshold: auto`, the corpus median length."""
    heads = model.heads
    if heads.threshold == "auto":
        heads = dataclasses.replace(heads, threshold=round(float(meta["median_length"])))
    return dataclasses.replace(model, vocab_size=vocab_size, heads=heads)


def _rows(dataset: Any, indices: Sequence[int]) -> list[dict[str, Any]]:
    cols = dataset[list(indices)]
    return [dict(zip(cols, values, strict=True)) for values in zip(*cols.values(), strict=True)]


def _batches(
    dataset: Any, collator: MlmCollator, batch_size: int, seed: int, training: Training
) -> ShardedBatches:
    lengths = list(dataset["length"])

    def plan(epoch: int) -> list[list[int]]:
        return length_bucketed_batches(lengths, batch_size, seed, epoch)

    def collate(indices: Sequence[int], key: int) -> dict[str, torch.Tensor]:
        return collator(_rows(dataset, indices), key)

    return training.batches(plan, collate, batch_size)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _export(module: torch.nn.Module, cfg: ModelConfig, vocab_dir: Path, out: Path, extra: dict):
    """Write OUTPUT/model atomically: build beside it, then swap in."""
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_pretrained(module, cfg, tmp, extra=extra)
    copy_vocabulary(vocab_dir, tmp)  # the vocabulary travels with the weights
    old = out.with_name(f".{out.name}.old")
    if out.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)
    return out


def export_name(tokens: float) -> str:
    """The folder of the export at a token count: `tokens-1000000`."""
    return f"tokens-{int(tokens)}"


# pretrain settings that decide which weights the model has (the rest may change on --resume)
MODEL_SHAPING = ("objective", "sop", "contrastive", "generator_ratio", "sparse_last_layer")


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
        _note(
            f"note: --resume continues with settings changed since {saved_path}: "
            + "; ".join(other)
        )


def run_pretraining(
    cfg: Config, resume: bool = False, wait: bool = False, eval_only: bool = False
) -> Path:
    """Train (or continue) the run that `cfg.pretrain.output` names; returns OUTPUT/model.
    With `eval_only`, score `pretrain.init_from` on the corpus's held-out split instead (no
    step, no checkpoint) and return OUTPUT/eval.json.

    The main process holds the output folder (`tibnlp.folder_lock`) for the whole run, so a
    second run on it refuses at once (or with `wait`, starts when the first is done) instead
    of interleaving checkpoints.
    """
    p = cfg.pretrain
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
    _require_folder_path(Path(p.output))
    # the batch split over the processes, before the process group, the output folder and
    # the corpus's tokenising (minutes): start_training would refuse it only after them
    accumulation_steps(p.batch_size, p.micro_batch_size, planned_world_size())
    world = init_distributed(cfg.engine)
    if not world.is_main:
        wait_for_main(world)  # (with --wait, for as long as another run holds the folder)
        return _pretrain(cfg, resume, world, eval_only)
    with hold_folder(Path(p.output), wait=wait, notify=_note):
        wait_for_main(world)
        return _pretrain(cfg, resume, world, eval_only)


def _require_folder_path(output: Path) -> None:
    """`pretrain.output` must be a folder, or a path one can be made at: a file there (or
    above it) failed with a FileExistsError traceback from the folder lock."""
    blocker = blocking_file(output)
    if blocker is not None:
        where = "" if blocker == output else f" ({blocker}, above it, is a file)"
        raise ConfigError(
            f"config key 'pretrain.output': {output} is not a folder{where}",
            "set pretrain.output to a folder path (it is made if absent)",
        )


def _note(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _pretrain(cfg: Config, resume: bool, world: World, eval_only: bool = False) -> Path:
    p = cfg.pretrain
    budget = parse_duration(p.time_budget)
    output = Path(p.output)
    if not eval_only:  # (in the held folder: a run busy in it is named first)
        checkpoint.require_resumable(output / "checkpoints", resume)
        if not resume and (output / "model").exists():  # its checkpoints deleted to save space
            raise TibnlpError(
                f"{output / 'model'} holds the model of an earlier run; a new run would replace it",
                "set pretrain.output to a new folder, or move that model away first",
            )
    vocab_dir = Path(p.vocab)
    vocab = Vocabulary.load(vocab_dir)
    init_state = None
    before: dict[str, Any] = {}  # the facts (tokens, FLOPs) of the model a run continues from
    if p.init_from:
        cfg.model, init_state, before = initial_weights(Path(p.init_from), vocab, vocab_dir)
    if resume:  # before config.yaml is written over: it must keep describing the checkpoints
        require_same_model(output, cfg, world.is_main)
    if p.seq_len > cfg.model.max_len:  # before anything is written: the encoder would refuse
        raise ConfigError(
            f"config key 'pretrain.seq_len': {p.seq_len} is above model.max_len "
            f"{cfg.model.max_len}" + (f" (of {p.init_from})" if p.init_from else ""),
            "lower pretrain.seq_len or raise model.max_len",
        )
    # an empty split the run reads, before its config and tokenised data are written
    require_documents(Path(p.corpus), "heldout" if eval_only else "train")
    # segment recurrence: MLM over chains of consecutive segments (tibnlp.data.segment_chains)
    chain = cfg.pretrain.recurrence_segments if cfg.model.recurrence.enabled else 0
    electra = p.objective == "electra"
    if p.contrastive and chain:
        raise ConfigError(
            "pretrain.contrastive does not read segment chains (model.recurrence.mem_len)",
            "set pretrain.contrastive=0 for a recurrent model",
        )
    if electra and chain:
        raise ConfigError(
            "pretrain.objective=electra does not read segment chains (model.recurrence.mem_len)",
            "use pretrain.objective=mlm for a recurrent model",
        )
    # --eval-only scores the held-out split: it tokenises that split alone, into a folder of
    # its own (a training run's data/ in the same output stays as it is)
    data_dir = output / ("data-heldout" if eval_only else "data")
    if world.is_main:
        output.mkdir(parents=True, exist_ok=True)
        num_proc = cfg.engine.num_workers or (os.cpu_count() or 1)
        try:
            build_pretraining_dataset(
                Path(p.corpus),
                vocab,
                p.seq_len,
                data_dir,
                p.seed,
                num_proc,
                segments=chain,
                sop_prob=p.sop_prob if p.sop else 0.0,
                masking=p.masking,
                splits=("heldout",) if eval_only else SPLITS,
                # a one-sentence chunk is cut into A and B only for a task that reads the pair
                pairs=p.sop or p.contrastive > 0,
            )
        except OtherInputsError as exc:
            if not resume:
                raise
            # "choose another output folder or delete it" does not fit a resume: deleting the
            # data the checkpoints' data position points into would continue on other data
            raise DataError(
                f"--resume: {data_dir}, the data the checkpoints were trained on, was "
                "tokenised from other inputs than this config names (another corpus, "
                "vocabulary, seq_len, seed, masking or sop setting)",
                f"resume with the data settings in {output / 'config.yaml'}; to train on other "
                f"data, start a new run with pretrain.init_from={output / 'model'}",
            ) from exc
    wait_for_main(world)  # the tokenising may outlast a collective's timeout
    splits, meta = load_pretraining_dataset(data_dir)
    model_cfg = resolve_model_config(cfg.model, vocab.size, meta)
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
    if p.eval_batches and not enough_heldout and not eval_only and world.is_main:
        # the run went on without any held-out score, the learning check silently off
        _note(
            f"note: the held-out split of {data_dir} has {len(splits['heldout'])} examples, "
            f"fewer than one batch (pretrain.batch_size={p.batch_size}): this run logs no "
            "eval/ metrics and has no learning check; lower pretrain.batch_size or prepare "
            "the corpus with a larger corpus.heldout_fraction"
        )
    # the run's config, once its inputs have passed the checks above (a refused run left one
    # describing a run that never started); a resumed run's is written once its checkpoint
    # has loaded (open_tracker); --eval-only's beside its eval.json, so that a training run's
    # config.yaml in the same folder keeps describing that run's checkpoints
    config_path = output / ("eval-config.yaml" if eval_only else "config.yaml")
    if world.is_main and not resume:
        dump_yaml(cfg, config_path)

    _seed_everything(p.seed)  # identical initial weights on every rank
    model: ElectraForPretraining | AlbertForPretraining
    if electra:
        model = ElectraForPretraining(
            model_cfg, p.generator_ratio, p.rtd_weight, p.sparse_last_layer
        )
    else:
        model = AlbertForPretraining(
            model_cfg,
            p.sparse_last_layer,
            segment_len=p.seq_len if chain else 0,
            sop=p.sop,
            contrastive=p.contrastive,
            temperature=p.contrastive_temperature,
        )
    if init_state is not None:
        load_initial(model, init_state, Path(p.init_from), p.objective)
    if p.skipgram.epochs:
        before = skipgram_start(
            model, model_cfg, p, splits["train"], meta, vocab, output, world, resume
        )
    rates = {"encoder.embeddings.word.": p.word_lr}  # (ELECTRA's generator shares it)
    training = start_training(
        model, cfg.engine, p.optimizer, p.batch_size, p.micro_batch_size, p.max_steps, world, rates
    )
    engine = training.engine
    _seed_everything(p.seed + 7919 * world.rank)  # distinct dropout streams per rank

    whole_word = p.masking == "whole_word"
    pairs = p.contrastive > 0  # each example's segments as two rows (same-document contrast)
    heldout = None
    if p.eval_batches and len(splits["heldout"]) >= p.batch_size:
        heldout = _batches(
            splits["heldout"],
            MlmCollator(
                vocab, p.mask_prob, p.max_ngram, p.seed + EVAL_SEED_OFFSET, whole_word, pairs
            ),
            p.batch_size,
            p.seed,
            training,
        )
    if eval_only:  # no train split was tokenised; no step is taken, so `train` is not drawn
        assert heldout is not None  # (refused above otherwise)
        train = heldout
    else:
        train = _batches(
            splits["train"],
            MlmCollator(vocab, p.mask_prob, p.max_ngram, p.seed, whole_word, pairs),
            p.batch_size,
            p.seed,
            training,
        )
    settings = LoopSettings(
        max_steps=p.max_steps,
        log_every=p.log_every,
        eval_every=p.eval_every,
        eval_batches=p.eval_batches,
        checkpoint_every=p.checkpoint_every,
        keep_checkpoints=p.keep_checkpoints,
        checkpoint_dir=output / "checkpoints",
        time_budget_s=budget,
        max_tokens=p.max_tokens,
        export_at_tokens=list(p.export_at_tokens),
    )
    if electra:
        flops_per_token = electra_flops_per_token(
            model_cfg, p.seq_len, p.mask_prob, p.generator_ratio
        )
    else:
        flops_per_token = training_flops_per_token(model_cfg, p.seq_len, p.mask_prob)
    run_facts = {
        "objective": p.objective,
        "vocab_sha256": vocab.sha256,
        "processes": world.size,
        "threads": torch.get_num_threads(),
        "hardware": hardware_name(),
        "flops_per_token": flops_per_token,
    }

    # a continued run counts the compute of the model it starts from: a curve or a budget
    # compares what the whole encoder cost (its own share stays in `continued_tokens`)
    continued = {"init_from": p.init_from} if p.init_from else {}

    def facts(at: Progress) -> dict[str, Any]:
        own = {**continued, "continued_tokens": at.tokens} if continued else {}
        return {
            "step": at.step,
            "tokens": float(before.get("tokens", 0.0)) + at.tokens,
            "train_seconds": round(float(before.get("train_seconds", 0.0)) + at.train_seconds, 3),
            "flops": float(before.get("flops", 0.0)) + at.tokens * flops_per_token,
            # a skip-gram warm start's cost, also when inherited from the init_from model
            **{k: v for k, v in before.items() if k.startswith("skipgram_")},
            **own,
            **run_facts,
        }

    def export(target: float, at: Progress) -> None:
        name = export_name(target)
        _export(engine.module, model_cfg, vocab_dir, output / "exports" / name, facts(at))
        print(f"exported {output / 'exports' / name} (step {at.step})", file=sys.stderr)

    loop = training.loop(train, heldout, settings, exporter=export)

    def order_probe() -> tuple[float, float]:  # the held-out batches the loop evaluates
        assert heldout is not None
        heldout.reset()
        batches = [
            loop._to_device(raw)
            for _ in range(min(max(p.eval_batches, 1), len(heldout)))
            for raw in heldout.next()
        ]
        mlm = engine.module.generator if electra else engine.module  # what predicts masks
        return order_accuracies(mlm, batches)

    check = LearningCheck(
        unigram_accuracy(splits["heldout"], set(vocab.special_ids)) if heldout else 0.0,
        p.warn_after if heldout else 0.0,
        lambda at: max(at.step / p.max_steps, loop.budget_fraction()),
        order_probe if heldout is not None and not chain else None,
        say=world.is_main,
    )
    loop.extra_state["learning_check"] = check  # a resumed run neither warns nor probes again

    def open_tracker(run_id: str | None) -> Tracker:
        """The run to log into: the checkpoint's (resume), the pipeline stage's
        (`tracking.run_id`), or a new one (standalone). Called on rank 0 once any
        checkpoint has loaded: a resumed run's config.yaml (its new max_steps, say) is
        written here, so a resume that fails leaves the file describing the checkpoints."""
        if resume:
            dump_yaml(cfg, output / "config.yaml")
        t = cfg.tracking
        in_stage = bool(t.run_id) and run_id is None
        tracking = dataclasses.replace(t, run_id=run_id or t.run_id)
        tracker = tracker_from_config(tracking, output.name, {"stage": "pretrain"})
        if run_id is not None:  # resumed: the run was described when it started
            return tracker
        if not in_stage:  # a pipeline stage's run already holds the flattened config
            tracker.log_params(to_dict(cfg))
        tracker.log_params(
            {
                "resolved.model.vocab_size": model_cfg.vocab_size,
                "resolved.model.heads.threshold": model_cfg.heads.threshold,
                "resolved.processes": world.size,
                "resolved.accumulation_steps": training.accumulation,
                "resolved.pretrain.corpus": p.corpus,
                "resolved.pretrain.vocab": p.vocab,
                "resolved.flops_per_token": round(flops_per_token),
                "resolved.hardware": run_facts["hardware"],
                **{f"resolved.{k}": v for k, v in before.items() if k.startswith("skipgram_")},
            }
        )
        tracker.set_tags(
            {
                "stage": "pretrain",
                "vocab.sha256": vocab.sha256,
                **provenance_tags(data=p.corpus, vocab=vocab_dir),
                **{f"data.{k}": str(v) for k, v in meta.items() if not isinstance(v, dict)},
                **{
                    f"data.{k}.{s}": str(n)
                    for k, v in meta.items()
                    if isinstance(v, dict)
                    for s, n in v.items()
                },
            }
        )
        tracker.log_artifact(config_path)
        tracker.log_artifact(vocab_dir, "vocabulary")
        return tracker

    def open_and_watch(run_id: str | None) -> Tracker:
        check.tracker = open_tracker(run_id)
        return check.tracker

    if eval_only:
        assert heldout is not None
        scores = {f"eval/{k}": v for k, v in loop.evaluate().items()}
        scores["eval/unigram_accuracy"] = check.unigram
        if world.is_main:
            tracker = open_tracker(None)
            tracker.log_metrics(scores, 0)
            tracker.set_tags({"eval_only": "true", "init_from": p.init_from})
            tracker.end()
            rows = min(p.eval_batches, len(heldout)) * p.batch_size
            report = {"model": p.init_from, "corpus": p.corpus, "rows": rows, **scores}
            atomic_write_text(output / "eval.json", json.dumps(report, indent=2) + "\n")
            print(json.dumps(report, indent=2))
        shutdown(world)
        return output / "eval.json"
    result = fit(loop, resume, open_and_watch, on_eval=check)
    if result.spent_before and world.is_main:
        setting = {"time_budget": "pretrain.time_budget (--time-budget)"}
        _note(
            f"note: --resume: the run's {result.spent_before.replace('_', ' ')} was already "
            f"spent at step {loop.step} ({loop.tokens:g} tokens, {loop.train_seconds:.0f} s): "
            f"no step to take; raise {setting.get(result.spent_before, 'pretrain.max_tokens')} "
            "to train on"
        )
    model_dir = output / "model"
    if world.is_main:
        missed = [t for t in p.export_at_tokens if t > loop.tokens]
        if missed:  # a learning curve's point that silently never came
            _note(
                f"note: pretrain.export_at_tokens {', '.join(str(int(t)) for t in missed)} not "
                f"reached: the run stopped ({result.stopped_by}) at step {loop.step} after "
                f"{int(loop.tokens)} training tokens; --resume with a larger pretrain.max_steps "
                "(or budget) to reach them"
            )
        extra = {
            **facts(loop.progress),
            "stopped_by": result.stopped_by,
            "mlflow_run_id": result.tracker.run_id or "",
        }
        _export(engine.module, model_cfg, vocab_dir, model_dir, extra)
        result.tracker.log_artifact(model_dir, "model")
        result.tracker.set_tags({"stopped_by": result.stopped_by, "final_step": str(result.step)})
        result.tracker.end()
    shutdown(world)
    return model_dir
