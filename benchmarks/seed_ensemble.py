"""Two systems' seed ensembles on TNCC titles: how much of a gain is the seeds' variance?

A fine-tuned classifier's score moves with its seed; the mean over seeds, which the targets
use, keeps each seed's own errors. The mean of the seeds' class probabilities (an ensemble)
averages much of that seed noise away. If one system's lead over another shrinks when both
are ensembled, part of the lead was the other's higher variance, not what it knows. This
script scores each system's ensemble on validation and test (macro-F1) and gives A - B with
its 95 % interval over the items (the paired bootstrap of `tibnlp finetune compare`).

    python benchmarks/seed_ensemble.py SYSTEM_A SYSTEM_B    # folders holding seed-*/
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tibnlp.data.tasks import load_tncc
from tibnlp.errors import run_script
from tibnlp.evaluation.predict import mean_proba
from tibnlp.evaluation.significance import paired_bootstrap

PARTS = ("validation", "test")


def ensemble_predictions(system: Path, texts: list[str]) -> tuple[list[int], list[str]]:
    """Argmax of the mean class probabilities of every `seed-*` classifier under `system`."""
    seeds = sorted(system.glob("seed-*"))
    if not seeds:
        raise SystemExit(f"{system}: no seed-* classifier folders")
    probs, labels = mean_proba(seeds, texts)
    return probs.argmax(1).tolist(), labels


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", type=Path, help="system A: a folder of seed-* classifiers")
    ap.add_argument("b", type=Path, help="system B, compared on the same items")
    ap.add_argument("--resamples", type=int, default=2000)
    args = ap.parse_args()
    data = load_tncc("title")
    for part in PARTS:
        examples = data.splits[part]
        texts = [e.text for e in examples]
        pred_a, labels = ensemble_predictions(args.a, texts)
        pred_b, labels_b = ensemble_predictions(args.b, texts)
        if not labels == labels_b == data.labels:
            raise SystemExit("the two systems and the dataset differ in their label lists")
        true = [e.label for e in examples]
        d = paired_bootstrap(true, [pred_a], [pred_b], len(labels), resamples=args.resamples)
        print(
            f"{part}: ensemble macro-F1 A {100 * d.a:.2f}, B {100 * d.b:.2f}, "
            f"A - B {100 * d.diff:+.2f} {d.interval()} ({d.items} items)"
        )


if __name__ == "__main__":
    run_script(main)
