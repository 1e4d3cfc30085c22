"""Documents longer than the window in `tibnlp finetune classify` (`finetune.long_document`).

The window is the classifier's `max_len` (`finetune.max_len`, or the task default); a document
is read up to `finetune.document_max_len` tokens. The readings (`truncate`, `segments`,
`memory`) live in `tibnlp.models.long_documents`; the one chosen is recorded in the
classifier's `reading`, so `tibnlp predict` rebuilds it. This module turns the fine-tuning
settings into that `Reading`, checks them, and prepares GEMFormer's selector:

- `memory`: the memory is selected by `finetune.memory_selection`: `finetuned` (GEMFormer as
  published: the model being fine-tuned with the pretrained MLM head, refreshed at each epoch
  start) or `frozen` (the pretrained MLM, once: the paper's ablation). Tokens with predictive
  entropy below `finetune.global_memory.threshold` (nats; first `budget` in document order)
  are prepended to every window as `[CLS] memory [SEP] window`. The memory's size and share
  of the document at the start (mean per split) are logged to every seed's MLflow run.

Pooling (the same heads as short texts): the CNN head convolves over every content token's
state, each taken from the window that read it, concatenated in document order (so it pools
over the whole document); the linear head uses position 0, the last window's [CLS] state
(`segments`) or the mean of the windows' [CLS] states (`memory`). Every reading runs on the
model's device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from torch import nn

from tibnlp.config.finetune import FinetuneConfig
from tibnlp.config.model import ModelConfig
from tibnlp.errors import ConfigError
from tibnlp.models.long_documents.memory_reader import MemoryReader
from tibnlp.models.long_documents.reading import Reading


def reading_of(ft: FinetuneConfig, model_cfg: ModelConfig, window: int) -> Reading:
    """The `Reading` the fine-tuning settings ask for, checked against the model."""
    if ft.long_document == "truncate":
        return Reading()
    if ft.encoder != "albert":
        raise ConfigError(
            f"config key 'finetune.long_document': {ft.long_document} needs the ALBERT encoder",
            "use finetune.long_document=truncate with encoder 'none'",
        )
    # read as set, a cap below one window included (then one shorter window)
    reading = Reading(ft.long_document, window, ft.document_max_len)
    if ft.long_document == "segments":
        return reading
    if ft.random_init:
        raise ConfigError(
            "config key 'finetune.long_document': memory selects tokens with the pretrained "
            "MLM head, so it needs a pretrained model",
            "pass --model DIR (a pretraining output) or use long_document=segments",
        )
    gm = ft.global_memory
    reading.selection, reading.memory = ft.memory_selection, gm
    need = reading.positions(window)
    if need > model_cfg.max_len:  # the encoder refuses longer rows, whatever its positions
        raise ConfigError(
            f"config key 'finetune.global_memory.budget': [CLS] + {gm.budget} memory + [SEP] + "
            f"a {window}-token window is {need} positions > the model's max_len "
            f"{model_cfg.max_len}",
            "lower finetune.global_memory.budget or finetune.max_len",
        )
    return reading


def prepare_reader(
    reader: nn.Module, ft: FinetuneConfig, ids: dict[str, list[list[int]]]
) -> tuple[dict[str, float], Callable[[int], None] | None]:
    """For a GEMFormer reader: load its selector from the pretrained model, select every
    split's memory with it; return the figures to log and the hook refreshing the training
    documents' memory at each epoch start but the first (`finetuned`; None otherwise).
    "The first": the snapshot just taken serves one epoch 0 only; a later epoch 0 is a
    training starting over (a soup's next copy, from the seed's weights; the main phase after
    an LP-FT probe, whose encoder the probe left as it was: the same memory, one more pass),
    which must not read the memory the last copy's trained weights chose
    (and a resumed soup, whose earlier copies are loaded, not trained, would read another)."""
    if not isinstance(reader, MemoryReader):
        return {}, None
    from tibnlp.models.memory_report import load_mlm

    mlm, _ = load_mlm(Path(ft.model))
    reader.load_mlm(mlm)
    stats: dict[str, float] = {}
    for split, docs in ids.items():
        reader.fill(docs, ft.eval_batch_size)
        stats.update({f"{split}_{k}": v for k, v in reader.stats(docs).items()})
    if reader.selection != "finetuned":
        return stats, None
    train: Sequence[Sequence[int]] = ids["train"]
    unused = [True]  # the snapshot just taken, not yet read by an epoch

    def refresh(epoch: int) -> None:
        if epoch == 0 and unused[0]:  # taken with the weights this epoch starts from
            unused[0] = False
            return
        unused[0] = False
        reader.refresh()
        reader.fill(train, ft.eval_batch_size)

    return stats, refresh
