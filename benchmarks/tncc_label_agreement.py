"""How often TNCC gives one title the same label twice: a bound on what any classifier can score.

Some titles occur more than once (in train, and across train and validation/test). When the
same text carries two labels, no classifier gets both right. If a text's labels are
independent draws from one distribution p over the classes, two draws agree with
probability sum(p_c^2), and the best any classifier can do on that text is max(p_c). Since
sum(p^2) <= max(p) <= sqrt(sum(p^2)), the agreement rate a between a repeated title's train
label and its test label bounds the attainable accuracy on such titles: a <= best <= sqrt(a)
(Jensen for the upper end). The repeats are not a random sample of titles, so the bound is for
them; how far it carries to the rest is a reading, not a measurement. With classifier
directories (`seed-N` folders), their accuracy on the repeated and the other titles is put
beside it.

    python benchmarks/tncc_label_agreement.py [CLASSIFIER_DIR ...] [--out FILE]
"""

from __future__ import annotations

import argparse
import math
from collections import Counter, defaultdict
from pathlib import Path

from tibnlp.data.labelled import model_text
from tibnlp.data.tasks import load_tncc
from tibnlp.errors import run_script
from tibnlp.evaluation.leakage import unseen_indices
from tibnlp.evaluation.predict import Predictor
from tibnlp.fsutil import atomic_write_text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("classifiers", nargs="*", type=Path, help="classifier directories")
    parser.add_argument("--out", type=Path, default=None, help="write the table here too")
    args = parser.parse_args()
    data = load_tncc("title")

    def key(text: str) -> str:  # what the model sees: two spellings of one title are one
        return model_text(text, "tsheg-trimmed", data.join_spaced_syllables)

    train: dict[str, list[int]] = defaultdict(list)
    for e in data.splits["train"]:
        train[key(e.text)].append(e.label)
    repeated = [labels for labels in train.values() if len(labels) > 1]
    conflicting = sum(1 for labels in repeated if len(set(labels)) > 1)
    lines = [
        "| split | titles | also in train | same label as in train | attainable accuracy on "
        "those (bounds) |",
        "|---|---:|---:|---:|---|",
    ]
    for split in ("validation", "test"):
        items = data.splits[split]
        seen = [e for e in items if key(e.text) in train]
        # agreement of the item's label with a random train copy of the same text
        agree = sum(Counter(train[key(e.text)])[e.label] / len(train[key(e.text)]) for e in seen)
        if not seen:
            lines.append(f"| {split} | {len(items)} | 0 | - | - |")
            continue
        a = agree / len(seen)
        lines.append(
            f"| {split} | {len(items)} | {len(seen)} | {100 * a:.1f} % | "
            f"{100 * a:.1f} to {100 * math.sqrt(a):.1f} % |"
        )
    lines.append(
        f"\nInside train: {len(repeated)} texts occur more than once, {conflicting} of them "
        "with more than one label."
    )
    if args.classifiers:
        test = data.splits["test"]
        other = unseen_indices(data.texts("train"), data.texts("test"), key)
        seen_idx = sorted(set(range(len(test))) - set(other))
        lines += [
            "\n| classifier | test accuracy | on titles also in train | on the others |",
            "|---|---:|---:|---:|",
        ]
        for directory in args.classifiers:
            predictor = Predictor(directory)
            names = predictor.meta.labels
            pred = [names.index(r["prediction"]) for r in predictor.predict([e.text for e in test])]
            gold = [names.index(data.labels[e.label]) for e in test]  # in the classifier's order

            def acc(idx: list[int], pred: list[int] = pred, gold: list[int] = gold) -> str:
                if not idx:
                    return "-"
                return f"{100 * sum(pred[i] == gold[i] for i in idx) / len(idx):.1f} %"

            every = list(range(len(test)))
            lines.append(f"| {directory} | {acc(every)} | {acc(seen_idx)} | {acc(other)} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        atomic_write_text(args.out, text)


if __name__ == "__main__":
    run_script(main)
