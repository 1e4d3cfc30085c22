"""The task's splits as the classifier reads them: texts in the model's input form, ids cut at
the read length (and what the cut took), and the records and classes that would make a score
mislead (textless or unknown-only records, classes `limit_train` leaves out or an evaluation
split lacks). Apart from `finetune_setup`, which resolves the encoder and vocabulary these
are read with.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from tibnlp.data.collate import encode_counting_cuts
from tibnlp.data.labelled import STORED_TEXT_FORM, Example, LabelledSet, model_text
from tibnlp.errors import DataError
from tibnlp.text.vocab import Vocabulary


def texts(data: LabelledSet, split: str, form: str) -> list[str]:
    """A split's texts in the classifier's input form (loaded texts are normalised already)."""
    if form == STORED_TEXT_FORM:
        return data.texts(split)
    return [model_text(t, form, data.join_spaced_syllables) for t in data.texts(split)]


def encode_splits(
    data: LabelledSet, vocab: Vocabulary, form: str, read: int, limit_train: int
) -> tuple[dict[str, list[list[int]]], dict[str, dict[str, int]]]:
    """Every split as ids cut at the read length, textless and unknown records handled
    (`drop_textless`, `warn_unknown`), train kept to `limit_train` (0: all); with, per split,
    what the cut took (`cut_summary`)."""
    encoded = {
        split: encode_counting_cuts(vocab, texts(data, split, form), read) for split in data.splits
    }
    drop_textless(data, vocab, form, encoded)
    warn_unknown(data, vocab, encoded)
    ids = {split: x for split, (x, _) in encoded.items()}
    dropped = {split: d for split, (_, d) in encoded.items()}
    if limit_train:
        ids["train"] = ids["train"][:limit_train]
        dropped["train"] = dropped["train"][:limit_train]
    return ids, {s: cut_summary(d) for s, d in dropped.items()}


def cut_summary(dropped: Sequence[int]) -> dict[str, int]:
    """What the cut at the read length took from a part (`encode_counting_cuts`' per-text
    pieces dropped): the texts cut, and the pieces cut off them."""
    return {"texts": sum(n > 0 for n in dropped), "tokens_dropped": sum(dropped)}


def _records_named(examples: Sequence[Example]) -> str:
    """The first ten records by FILE:LINE (by id when read from elsewhere)."""
    named = [e.where or f"id '{e.id}'" for e in examples]
    return ", ".join(named[:10]) + (" ..." if len(named) > 10 else "")


def drop_textless(
    data: LabelledSet,
    vocab: Vocabulary,
    form: str,
    encoded: dict[str, tuple[list[list[int]], list[int]]],
) -> None:
    """Records that read as no text in the model's input form (a text of closing shads and
    tshegs only, which tsheg-trimmed removes): refused in an evaluation split (scored on
    [CLS] [SEP] alone), left out of train with a warning, as a blank text is by the loader,
    which checks the stored form only."""
    trimmed = ", closing shads and tshegs removed" if form == "tsheg-trimmed" else ""
    for split, examples in data.splits.items():
        rows, cuts = encoded[split]
        keep = [bool(vocab.text_ids(row)) for row in rows]
        empty = [e for e, kept in zip(examples, keep, strict=True) if not kept]
        if not empty:
            continue
        shown = _records_named(empty)
        said = f"no text once read as the model reads it ({form}{trimmed})"
        if split != "train":
            raise DataError(
                f"dataset '{data.name}': {len(empty)} {split} record(s) hold {said}: {shown}",
                "an evaluation item needs a text; fix or remove the record(s)",
            )
        print(
            f"warning: dataset '{data.name}': {len(empty)} training record(s) with {said} left "
            f"out of training: {shown}",
            file=sys.stderr,
            flush=True,
        )
        data.splits[split] = [e for e, kept in zip(examples, keep, strict=True) if kept]
        encoded[split] = (
            [r for r, kept in zip(rows, keep, strict=True) if kept],
            [c for c, kept in zip(cuts, keep, strict=True) if kept],
        )


def warn_unknown(
    data: LabelledSet, vocab: Vocabulary, encoded: dict[str, tuple[list[list[int]], list[int]]]
) -> None:
    """Name the texts the vocabulary knows nothing of (only [UNK]: another script), as
    `tibnlp predict` does: a set of them trains on nothing, and the only sign was a seed
    "not learning" with advice about the learning rate."""
    for split, examples in data.splits.items():
        rows = encoded[split][0]
        unknown = [e for e, row in zip(examples, rows, strict=True) if vocab.knows_none(row)]
        if not unknown:
            continue
        shown = _records_named(unknown)
        print(
            f"warning: dataset '{data.name}': {len(unknown)} of {len(rows)} {split} text(s) hold "
            "no piece the vocabulary knows, only [UNK] (not Tibetan text?): the classifier "
            f"reads nothing of them: {shown}",
            file=sys.stderr,
            flush=True,
        )


def classes_left_out(data: LabelledSet, limit: int) -> str:
    """What `finetune.limit_train` leaves out, or "". It keeps the first N training examples:
    right for TNCC, whose file is in shuffled order, but a file sorted by label (TUSA) trains
    on one class, and its score would read as a result. Not refused: a smoke run may want
    64 examples of an 8-class set; said loudly, with the N that holds every class."""
    targets = data.targets("train")
    wanted, kept = set(targets), set(targets[:limit])
    if not limit or kept == wanted:
        return ""
    seen: set[int] = set()
    enough = 0  # the first N that holds every class
    while seen != wanted:
        seen.add(targets[enough])
        enough += 1
    missing = ", ".join(data.labels[i] for i in sorted(wanted - kept))
    return (
        f"finetune.limit_train={limit}: the first {limit} training examples of {data.name} "
        f"hold {len(kept)} of its {len(wanted)} classes (never trained on: {missing}); its "
        f"training file is not in shuffled order. Every class is in the first {enough}: set "
        "finetune.limit_train to that or more (0: all) for a result"
    )


def classes_absent(data: LabelledSet) -> str:
    """The classes with no validation or test item, or "". Macro averages run over the full
    label list (`compute_metrics`), so each of them scores F1 0 there: WCM-bo keeps Nature,
    Economy (no item) and Education (one, in train) for CINO's ids, and its test macro-F1
    cannot pass 70%. Said beside the result, so the figure is not read as the mean over the
    classes that occur."""
    parts = []
    for split in ("validation", "test"):
        present = set(data.targets(split))
        missing = [name for i, name in enumerate(data.labels) if i not in present]
        if missing:
            ceiling = 100 * len(present) / len(data.labels)
            parts.append(
                f"{split}: {len(missing)} of {len(data.labels)} classes have no item "
                f"({', '.join(missing)}); macro averages count them as 0, so macro-F1 is at "
                f"most {ceiling:.0f}%"
            )
    return "; ".join(parts)
