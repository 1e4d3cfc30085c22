"""Does each pretrained model use word order? Held-out MLM accuracy on text as written and on
the same text shuffled (`tibnlp.evaluation.word_order`), one row per model directory.

The held-out split and the masking (rate, n-gram spans, seed) are the same for every model,
so rows compare. A model whose two accuracies are close reads a bag of pieces.

    PYTHONPATH=. python benchmarks/bench_word_order.py \
        --data runs/pipelines/curve/pretrain/out-*/data \
        MODEL_DIR [MODEL_DIR ...] --out benchmarks/results/word_order.md

A MODEL_DIR is a pretraining run's model folder (MLM head included) on the vocabulary the data
was tokenised with: an encoder-only folder (its MLM head would be a random one, scored as if
trained) or another vocabulary (the pieces would be other pieces) is refused before any scoring.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from tibnlp.data.masking import MlmCollator
from tibnlp.data.pretraining import load_pretraining_dataset
from tibnlp.errors import DataError, run_script
from tibnlp.evaluation.word_order import order_accuracies
from tibnlp.fsutil import atomic_write_text
from tibnlp.models.memory_report import load_mlm
from tibnlp.text.vocab import Vocabulary
from tibnlp.training.engine import hardware_name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", type=Path, help="pretrained model directories")
    ap.add_argument("--data", type=Path, required=True, help="a pretraining run's data folder")
    ap.add_argument("--rows", type=int, default=512, help="held-out rows scored")
    ap.add_argument("--mask-prob", type=float, default=0.3)
    ap.add_argument("--max-ngram", type=int, default=3)
    ap.add_argument("--out", type=Path, help="markdown table written here as well")
    args = ap.parse_args()
    torch.set_num_threads(1)
    splits, meta = load_pretraining_dataset(args.data)
    models = {}
    for model_dir in args.models:
        vocab = Vocabulary.load(model_dir)
        if vocab.sha256 != meta["vocab_sha256"]:
            raise DataError(
                f"{model_dir}: its vocabulary is not the one {args.data} was tokenised with",
                "score each model on the data of a run that used its vocabulary",
            )
        models[model_dir] = load_mlm(model_dir)[0], vocab
    heldout = splits["heldout"]
    rows = min(args.rows, len(heldout))
    lines = [
        f"held-out rows: {rows}; masking {args.mask_prob:.0%}, spans up to {args.max_ngram}; "
        f"{hardware_name()}",
        "",
        "| model | as written % | shuffled % | gap (points) |",
        "|---|---:|---:|---:|",
    ]
    for model_dir, (model, vocab) in models.items():
        collate = MlmCollator(vocab, args.mask_prob, args.max_ngram, 123)
        batches = [
            collate([heldout[i] for i in range(start, min(start + 64, rows))], start)
            for start in range(0, rows, 64)
        ]
        written, shuffled = order_accuracies(model, batches)
        lines.append(
            f"| {model_dir} | {100 * written:.2f} | {100 * shuffled:.2f} | "
            f"{100 * (written - shuffled):.2f} |"
        )
        print(lines[-1], flush=True)
    if args.out:
        atomic_write_text(args.out, "\n".join(lines) + "\n")


if __name__ == "__main__":
    run_script(main)
