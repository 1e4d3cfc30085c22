"""Held-out MLM accuracy by how often the masked piece occurs in the pretraining data: does a
masking choice (`pretrain.mask_rarity`) teach the rare pieces better, and at what cost to the
common ones? One row per model directory, one column per frequency band.

Every model reads the same held-out rows with the same uniform masks (rate, n-gram spans,
seed), so rows compare; the bands count each piece's occurrences in the train split of one
pretraining output's tokenised corpus (`--corpus`: the folder `tibnlp pretrain` wrote, OUT,
holding data/ and model/), whose held-out split is the text scored. Accuracy is top-1 over the
masked pieces of the band, with their count. A model must carry its MLM head (an MLM
pretraining's model folder): an ELECTRA discriminator or a bare encoder is refused.

    PYTHONPATH=. python benchmarks/mlm_by_rarity.py \
        --corpus runs/pipelines/quickstart/pretrain/out-* \
        MODEL_DIR [MODEL_DIR ...] --out benchmarks/results/mlm_by_rarity.md
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from benchmarks.corpus_coverage import corpus_counts
from tibnlp.data.masking import IGNORE_INDEX, MlmCollator
from tibnlp.data.pretraining import load_pretraining_dataset
from tibnlp.errors import DataError, run_script
from tibnlp.fsutil import atomic_write_text
from tibnlp.models.memory_report import load_mlm
from tibnlp.models.pretraining import AlbertForPretraining
from tibnlp.text.vocab import Vocabulary
from tibnlp.training.engine import hardware_name

BANDS = ((0, 20), (20, 200), (200, 2000), (2000, None))  # occurrences in the train split


def band_name(lo: int, hi: int | None) -> str:
    return f">= {lo}" if hi is None else f"{lo}-{hi - 1}"


def piece_bands(counts: np.ndarray) -> np.ndarray:
    """Each piece's band index: the band whose [lo, hi) holds its count."""
    edges = np.array([lo for lo, _ in BANDS[1:]])
    return np.searchsorted(edges, counts, side="right").astype(np.int64)


def check_corpus(folder: Path) -> None:
    """`--corpus` must be a pretraining output (data/ and model/), not its model folder."""
    if (folder / "data").is_dir() and (folder / "model").is_dir():
        return
    hint = "give the folder `tibnlp pretrain` wrote (pretrain.output: it holds data/ and model/)"
    if folder.name == "model" and (folder.parent / "data").is_dir():
        hint += f"; {folder} is its model folder: pass {folder.parent}"
    raise DataError(f"--corpus {folder}: not a pretraining output (no data/ or model/)", hint)


@torch.no_grad()
def band_hits(
    model: AlbertForPretraining, batches: list[dict[str, torch.Tensor]], band_of: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(hits, masked pieces) per band over `batches`."""
    model.eval()
    hits = np.zeros(len(BANDS), dtype=np.int64)
    total = np.zeros(len(BANDS), dtype=np.int64)
    for b in batches:
        labels = b["mlm_labels"]
        sel = labels != IGNORE_INDEX
        hidden = model.encoder(b["input_ids"], b["attention_mask"], b["token_type_ids"]).hidden
        right = (model.mlm_logits(hidden[sel]).argmax(-1) == labels[sel]).numpy()
        bands = band_of[labels[sel].numpy()]
        total += np.bincount(bands, minlength=len(BANDS))
        hits += np.bincount(bands, weights=right, minlength=len(BANDS)).astype(np.int64)
    return hits, total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", type=Path, help="pretrained model directories")
    ap.add_argument(
        "--corpus", type=Path, required=True, help="a pretraining output's model folder"
    )
    ap.add_argument("--rows", type=int, default=2048, help="held-out rows scored")
    ap.add_argument("--mask-prob", type=float, default=0.3)
    ap.add_argument("--max-ngram", type=int, default=3)
    ap.add_argument("--out", type=Path, help="markdown table written here as well")
    args = ap.parse_args()
    if args.rows < 1:
        ap.error("--rows must be >= 1")
    torch.set_num_threads(1)
    check_corpus(args.corpus)
    heldout = load_pretraining_dataset(args.corpus / "data")[0]["heldout"]
    rows = min(args.rows, len(heldout))
    vocab = Vocabulary.load(args.corpus / "model")  # what the corpus was tokenised with
    counts = corpus_counts(args.corpus, vocab.size)
    band_of = piece_bands(counts)
    collate = MlmCollator(vocab, args.mask_prob, args.max_ngram, 123)  # uniform masks
    batches = [
        collate([heldout[i] for i in range(start, min(start + 64, rows))], start)
        for start in range(0, rows, 64)
    ]
    names = [band_name(lo, hi) for lo, hi in BANDS]
    lines = [
        f"held-out rows: {rows}; uniform masking {args.mask_prob:.0%}, spans up to "
        f"{args.max_ngram}; bands: the piece's occurrences in the train split "
        f"({int(counts.sum()):,} pieces); {hardware_name()}",
        "",
        "| model | all % | " + " | ".join(f"{n} %" for n in names) + " |",
        "|---|---:|" + "---:|" * len(names),
    ]
    for model_dir in args.models:
        if Vocabulary.load(model_dir).sha256 != vocab.sha256:
            raise DataError(
                f"{model_dir}: another vocabulary than the corpus's ({args.corpus / 'model'})",
                "compare models pretrained on one vocabulary",
            )
        hits, total = band_hits(load_mlm(model_dir)[0], batches, band_of)
        cells = [f"{100 * h / max(t, 1):.2f} ({t:,})" for h, t in zip(hits, total, strict=True)]
        lines.append(
            f"| {model_dir} | {100 * hits.sum() / max(total.sum(), 1):.2f} | "
            + " | ".join(cells)
            + " |"
        )
        print(lines[-1], flush=True)
    if args.out:
        atomic_write_text(args.out, "\n".join(lines) + "\n")


if __name__ == "__main__":
    run_script(main)
