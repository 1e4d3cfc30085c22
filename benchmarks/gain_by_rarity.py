"""Where does a pretrained encoder's lead over its random-init twin come from on TNCC titles?

A twin learns each piece's meaning from the labelled titles alone, so it can know a piece only
as well as the training titles teach it; pretraining can add what the corpus says of pieces
the training titles hold rarely or never. This script splits the test (or validation) titles
by how well their rarest piece is covered in the training titles: the number of training
titles that contain it (0: a piece no training title has). The training titles are those the
systems were fine-tuned on (the first N with `finetune.limit_train`), cut into pieces in the
input form they read and by the vocabulary they read (refused when --vocab is another). Per
bucket it gives both systems' accuracy (mean over seeds), A - B with its 95 % interval over the
bucket's titles (paired bootstrap, `tibnlp finetune compare`'s), and the share of the whole
lead the bucket holds.
Accuracy, not macro-F1: a bucket misses whole classes, and F1 is not a sum over items.
`--by share` splits instead by the share of a title's pieces that are rare in the training
titles, so that one rare piece beside common ones does not decide a title's bucket.

    python benchmarks/gain_by_rarity.py ENCODER TWIN --vocab MODEL [--pool RUN]... \
        [--pool-b RUN]... [--by share]

ENCODER and TWIN: results.json files or folders (a `tibnlp finetune` output); --pool adds
runs of the encoder's system (other pretraining seeds), --pool-b runs of the twin's; MODEL: a
folder holding the vocabulary both systems read (a model or classifier folder).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tibnlp.data.labelled import STORED_TEXT_FORM, TEXT_FORMS, LabelledSet, model_text
from tibnlp.data.tasks import load_tncc
from tibnlp.errors import run_script
from tibnlp.evaluation.result_loader import load_one_result
from tibnlp.evaluation.significance import paired_bootstrap, pool_pair, row_predictions
from tibnlp.text.vocab import Vocabulary

EDGES = (0, 1, 5, 20)  # bucket lower bounds on the rarest piece's training-title count
RARE_BELOW = 20  # --by share: a piece is rare when fewer training titles hold it
SHARE_CUT = 0.2  # --by share: the buckets' edge on a title's share of rare pieces


def piece_sets(vocab: Vocabulary, texts: Sequence[str]) -> list[set[int]]:
    """The distinct regular pieces of each text (given in the model's input form,
    `input_form`)."""
    special = set(vocab.special_ids) - {vocab.unk_id}  # [UNK] stays: a piece no one knows
    return [set(vocab.encode(t)) - special for t in texts]


def title_counts(train: Sequence[set[int]]) -> dict[int, int]:
    """Each piece's number of training texts that hold it."""
    df: dict[int, int] = {}
    for pieces in train:
        for p in pieces:
            df[p] = df.get(p, 0) + 1
    return df


def rarest_counts(train: Sequence[set[int]], items: Sequence[set[int]]) -> np.ndarray:
    """For each item, the number of training texts holding its least covered piece (a text
    with no regular piece counts as fully covered)."""
    df, big = title_counts(train), len(train) + 1
    return np.array([min((df.get(p, 0) for p in s), default=big) for s in items])


def rare_shares(
    train: Sequence[set[int]], items: Sequence[set[int]], below: int = RARE_BELOW
) -> np.ndarray:
    """For each item, the share of its distinct pieces that fewer than `below` training texts
    hold (0 for a text with no regular piece): a reading that one rare piece beside a
    common decisive word cannot dominate, as it does the rarest piece's count."""
    df = title_counts(train)
    return np.array([sum(df.get(p, 0) < below for p in s) / len(s) if s else 0.0 for s in items])


def bucket_of(counts: np.ndarray, edges: Sequence[int] = EDGES) -> np.ndarray:
    """Index of the last edge each count reaches."""
    return np.searchsorted(np.asarray(edges), counts, side="right") - 1


def bucket_names(edges: Sequence[int] = EDGES) -> list[str]:
    names = []
    for i, lo in enumerate(edges):
        hi = edges[i + 1] - 1 if i + 1 < len(edges) else None
        names.append(f"{lo}" if hi == lo else f"{lo}-{hi}" if hi is not None else f">= {lo}")
    return names


def lead_share(part: float, total: float) -> str:
    """A bucket's share of the whole lead, as printed; "-" when there is no lead to share
    (two systems right on as many items), not a division by zero."""
    return f"{100 * part / total:.0f} %" if total else "-"


def share_buckets(shares: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """None of the pieces rare, up to SHARE_CUT of them, more."""
    buckets = np.where(shares == 0, 0, np.where(shares <= SHARE_CUT, 1, 2))
    cut = f"{100 * SHARE_CUT:g} %"
    return buckets, ["none", f"over 0, up to {cut}", f"over {cut}"]


def _one(rows: Sequence[dict[str, Any]], what: str, value: Any) -> Any:
    """The one `value(row)` every row that records it gives (None when none does)."""
    found = {row_value for row in rows if (row_value := value(row)) is not None}
    if len(found) > 1:
        names = ", ".join(f"{r['system']}: {value(r)}" for r in rows)
        raise SystemExit(f"the systems differ in their {what} ({names}): no common rarity")
    return found.pop() if found else None


def _notes(row: dict[str, Any]) -> dict[str, Any]:
    notes = row.get("notes")
    return notes if isinstance(notes, dict) else {}


def _input_form(row: dict[str, Any]) -> str:
    """The text form the row's classifiers read (notes.input_form starts with it); results
    written before the form was recorded read the stored form."""
    recorded = _notes(row).get("input_form")
    form = recorded.split(" ", 1)[0] if isinstance(recorded, str) else STORED_TEXT_FORM
    if form not in TEXT_FORMS:
        raise SystemExit(f"{row['system']}: unknown input form {recorded!r} in its notes")
    return form


def _train_size(row: dict[str, Any]) -> int | None:
    sizes = _notes(row).get("sizes")
    return sizes.get("train") if isinstance(sizes, dict) else None


def model_texts(
    rows: Sequence[dict[str, Any]], data: LabelledSet, vocab: Vocabulary, part: str
) -> tuple[list[str], list[str]]:
    """The training titles every system was fine-tuned on (the first `finetune.limit_train`
    of them, when set) and the `part` titles, in the input form they read: a piece's rarity
    is what the systems' own training titles teach of it, in the pieces `vocab` cuts them
    into, which must be the vocabulary the systems read."""
    sha = _one(rows, "vocabularies", lambda r: _notes(r).get("vocab_sha256"))
    if sha is not None and sha != vocab.sha256:
        raise SystemExit(
            f"--vocab: not the vocabulary the systems read (sha256 "
            f"{vocab.sha256[:12]}, theirs {sha[:12]}); give the model or vocab folder they used"
        )
    train = data.splits["train"]
    size = _one(rows, "numbers of training titles (finetune.limit_train)", _train_size)
    if size is not None and size > len(train):
        raise SystemExit(
            f"the systems were fine-tuned on {size} training titles, {data.name} has "
            f"{len(train)}: another version of the data"
        )
    form = _one(rows, "input forms", _input_form)

    def in_form(texts: list[str]) -> list[str]:
        if form == STORED_TEXT_FORM:  # loaded texts are in it already
            return texts
        return [model_text(t, form, data.join_spaced_syllables) for t in texts]

    used = train[:size] if size is not None else train
    return in_form([e.text for e in used]), in_form(data.texts(part))


def _seeds(n: int) -> str:
    return f"{n} seed" if n == 1 else f"{n} seeds"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", type=Path, help="system A (the encoder): results.json or its folder")
    ap.add_argument("b", type=Path, help="system B (its twin), scored on the same items")
    ap.add_argument("--vocab", type=Path, required=True, help="a folder with the vocabulary")
    ap.add_argument(
        "--pool", type=Path, action="append", default=[], help="another run of system A (repeat)"
    )
    ap.add_argument(
        "--pool-b", type=Path, action="append", default=[], help="another run of system B (repeat)"
    )
    ap.add_argument("--part", default="test", choices=("test", "validation"))
    ap.add_argument(
        "--by",
        default="rarest",
        choices=("rarest", "share"),
        help="rarest: the rarest piece's training-title count; share: the share of a title's "
        f"pieces that fewer than {RARE_BELOW} training titles hold",
    )
    ap.add_argument("--resamples", type=int, default=2000)
    args = ap.parse_args()

    runs_b = [load_one_result(p) for p in [args.b, *args.pool_b]]
    runs_a = [load_one_result(p) for p in [args.a, *args.pool]]
    row_a, row_b = pool_pair(runs_a, runs_b, args.part)
    true_a, preds_a = row_predictions(row_a, args.part)
    true_b, preds_b = row_predictions(row_b, args.part)
    data = load_tncc("title")
    if not row_a.get("labels") == row_b.get("labels") == data.labels:
        raise SystemExit("the two systems and TNCC's titles differ in their label lists")
    if true_a != true_b or true_a != data.targets(args.part):
        raise SystemExit(f"the two systems and TNCC's {args.part} titles differ in their items")
    vocab = Vocabulary.load(args.vocab)
    train_texts, texts = model_texts([*runs_a, *runs_b], data, vocab, args.part)
    train, items = piece_sets(vocab, train_texts), piece_sets(vocab, texts)
    if args.by == "share":
        buckets, names = share_buckets(rare_shares(train, items))
        column = f"share of pieces in < {RARE_BELOW} training titles"
    else:
        buckets, names = bucket_of(rarest_counts(train, items)), bucket_names()
        column = "rarest piece in N training titles"
    y = np.asarray(true_a)
    acc_a = np.mean([np.asarray(p) == y for p in preds_a], axis=0)  # per item, mean over seeds
    acc_b = np.mean([np.asarray(p) == y for p in preds_b], axis=0)
    total = acc_a.sum() - acc_b.sum()
    print(
        f"{data.name} {args.part}: {len(y)} titles; A {row_a['system']} ({_seeds(len(preds_a))}), "
        f"B {row_b['system']} ({_seeds(len(preds_b))}); lead in accuracy "
        f"{100 * total / len(y):+.2f} points"
    )
    print(f"| {column} | titles | A accuracy | B accuracy | A - B [95 %] | share of the lead |")
    print("|---|---:|---:|---:|---|---:|")
    for i, name in enumerate(names):
        idx = np.flatnonzero(buckets == i)
        if not len(idx):
            continue
        d = paired_bootstrap(
            y[idx].tolist(),
            [np.asarray(p)[idx].tolist() for p in preds_a],
            [np.asarray(p)[idx].tolist() for p in preds_b],
            len(data.labels),
            metric="accuracy",
            resamples=args.resamples,
        )
        share = lead_share(acc_a[idx].sum() - acc_b[idx].sum(), total)
        print(
            f"| {name} | {len(idx)} | {100 * d.a:.2f} | {100 * d.b:.2f} | "
            f"{100 * d.diff:+.2f} {d.interval()} | {share} |"
        )


if __name__ == "__main__":
    run_script(main)  # a folder of several systems, results without predictions: error, hint
