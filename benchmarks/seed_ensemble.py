"""Two systems' seed ensembles on TNCC titles: how much of a gain is the seeds' variance?

A fine-tuned classifier's score moves with its seed; the mean over seeds, which the targets
use, keeps each seed's own errors. The mean of the seeds' class probabilities (an ensemble)
averages much of that seed noise away. If one system's lead over another shrinks when both
are ensembled, part of the lead was the other's higher variance, not what it knows. This
script scores each system's ensemble on validation and test (macro-F1) and gives A - B with
its 95 % interval over the items (the paired bootstrap of `tibnlp finetune compare`).

    python benchmarks/seed_ensemble.py SYSTEM_A SYSTEM_B    # folders holding seed-*/

Each system's ensemble is of the seeds its results.json reports (all seed-*/ without one);
both are scored on the same titles in the same order, their probabilities in the dataset's
label order (a classifier of another label order is refused).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tibnlp.data.tasks import load_tncc
from tibnlp.errors import run_script
from tibnlp.evaluation.predict import mean_proba
from tibnlp.evaluation.result_loader import RESULTS_JSON, load_one_result
from tibnlp.evaluation.significance import paired_bootstrap

PARTS = ("validation", "test")


def seed_folders(system: Path) -> list[Path]:
    """The classifiers of the seeds `system`'s results.json reports (the seed-mean's), or,
    without one, every `seed-*` classifier folder. A folder fine-tuned again with fewer or
    other seeds keeps the old seed folders: globbing them mixed another run into the mean."""
    results = system / RESULTS_JSON
    if not results.is_file():
        seeds = sorted(p for p in system.glob("seed-*") if (p / "classifier.yaml").is_file())
        if not seeds:
            raise SystemExit(f"{system}: no results.json and no seed-* classifier folders")
        return seeds
    seeds = [system / f"seed-{s['seed']}" for s in load_one_result(results)["seeds"]]
    missing = [p.name for p in seeds if not (p / "classifier.yaml").is_file()]
    if not seeds or missing:
        raise SystemExit(
            f"{results}: its seeds' classifiers are missing ({', '.join(missing) or 'no seeds'})"
        )
    return seeds


def ensemble_predictions(system: Path, texts: list[str]) -> tuple[list[int], list[str]]:
    """Argmax of the mean class probabilities of `system`'s seed classifiers."""
    probs, labels = mean_proba(seed_folders(system), texts)
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
