"""Self-training on unlabelled Tibetan sentences (issue 11's lever, finetune_levers.md).

Every fine-tuning lever so far gave the encoder and its random-init twin the same gain, and
more labelled titles close the gap between them. Unlabelled text is where pretraining has
knowledge a twin lacks, so let the fine-tuned classifiers label some: sentences of the raw
corpora cut at shad, of title length, are classified by an ensemble of a system's fine-tuned
seeds (the mean of their probabilities), and the most confident ones per class join the
training titles with the ensemble's label (hard pseudo-labels). A student of the same system
is then fine-tuned on that data exactly as the teachers were. A twin's ensemble labels the
same sentences for the twin's student, so each system teaches itself: what differs is how
well its own classifiers read text they were not trained on (Du et al. 2021, "Self-training
improves pre-training for natural language understanding", retrieve in-domain sentences and
self-train; Xie et al. 2020, noisy student).

The script writes a data directory whose `tncc/` training file holds the 7,422 titles and
`--size` pseudo-labelled sentences, with the training titles' class shares (each class takes
its most confident sentences among those the ensemble assigns to it). Validation and test are
linked unchanged, so `TIBNLP_DATA=OUT tibnlp finetune tncc ...` fine-tunes on it and scores
the same titles. A sentence equal to any TNCC title (any split) is left out of the pool.

    python benchmarks/self_train.py --teachers S/seed-1 S/seed-2 S/seed-3 --out OUT
"""

from __future__ import annotations

import argparse
import json
import lzma
import random
import re
from collections import Counter
from pathlib import Path

import numpy as np

from tibnlp.data.datadir import data_dir, derive
from tibnlp.errors import run_script
from tibnlp.evaluation.predict import mean_proba
from tibnlp.text.sentences import SHADS
from tibnlp.text.syllables import syllables

TRAIN = "tncc_title_train.jsonl"
SPLITS = ("tncc_title_train.jsonl", "tncc_title_validation.jsonl", "tncc_title_test.jsonl")
SHAD_RUN = re.compile(f"[{SHADS}]+")


def title_form(sentence: str) -> str:
    """A corpus stretch in TNCC's title form: its syllables separated by single spaces, no
    tsheg, shad or other punctuation (Latin and other scripts dropped)."""
    return " ".join(syllables(sentence))


def pool_sentences(
    corpora: list[Path], min_len: int, max_len: int, exclude: set[str]
) -> list[tuple[str, str]]:
    """(source name, text) of every distinct stretch between shads of `min_len` to `max_len`
    syllables, in corpus order, none equal to a text in `exclude`."""
    seen = set(exclude)
    out = []
    for path in corpora:
        opener = lzma.open if path.suffix == ".xz" else open
        with opener(path, "rt", encoding="utf-8") as fh:
            for line in fh:
                for stretch in SHAD_RUN.split(line):
                    text = title_form(stretch)
                    if min_len <= text.count(" ") + 1 <= max_len and text not in seen:
                        seen.add(text)
                        out.append((path.name.split(".")[0], text))
    return out


def select(probs: np.ndarray, shares: np.ndarray, size: int) -> list[int]:
    """Row indices: for each class c, the round(size x shares[c]) rows the ensemble assigns
    to c with the highest probability (fewer where fewer are assigned to it)."""
    pred, conf = probs.argmax(1), probs.max(1)
    chosen: list[int] = []
    for c, share in enumerate(shares):
        rows = np.flatnonzero(pred == c)
        rows = rows[np.argsort(-conf[rows], kind="stable")]
        chosen += rows[: round(size * share)].tolist()
    return sorted(chosen)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--teachers",
        type=Path,
        nargs="+",
        required=True,
        help="fine-tuned classifier directories (a system's seeds)",
    )
    ap.add_argument("--out", type=Path, required=True, help="data directory to write")
    ap.add_argument(
        "--data",
        type=Path,
        default=None,
        help="source data directory (default: the data-directory setting)",
    )
    ap.add_argument(
        "--corpora",
        nargs="+",
        default=[
            "tibetan_tibettimes_news",
            "tibetan_nanhai",
            "tibetan_tibetanqa_encyclopedia",
            "tibetan_tibetcm_literature",
        ],
        help="corpus file stems under corpora/",
    )
    ap.add_argument("--pool", type=int, default=60000, help="sentences drawn from the corpora")
    ap.add_argument("--size", type=int, default=7422, help="pseudo-labelled sentences kept")
    ap.add_argument("--min-len", type=int, default=6)
    ap.add_argument("--max-len", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0, help="which pool sentences are drawn")
    args = ap.parse_args()
    if args.out.exists():
        raise SystemExit(f"{args.out} exists: choose a new --out")
    data = args.data or data_dir()
    records = {
        name: [json.loads(x) for x in (data / "tncc" / name).read_text("utf-8").splitlines()]
        for name in SPLITS
    }
    exclude = {title_form(r["text"]) for rs in records.values() for r in rs}
    corpora = [data / "corpora" / f"{stem}.txt.xz" for stem in args.corpora]
    for path in corpora:
        if not path.is_file():
            raise SystemExit(f"{path} does not exist: check --corpora and the data directory")
    pool = pool_sentences(corpora, args.min_len, args.max_len, exclude)
    random.Random(args.seed).shuffle(pool)
    pool = pool[: args.pool]
    probs, labels = mean_proba(args.teachers, [t for _, t in pool])
    train = records[TRAIN]
    counts = Counter(r["label"] for r in train)
    shares = np.array([counts[name] for name in labels]) / len(train)
    chosen = select(probs, shares, args.size)
    added = []
    for i in chosen:
        source, text = pool[i]
        c = int(probs[i].argmax())
        added.append(
            {
                "id": f"pseudo-{i}",
                "label": labels[c],
                "label_id": c,
                "text": text,
                "title": text,
                "text_tsheg": text.replace(" ", "\u0f0b"),
                "split": "train",
                "source": source,
                "confidence": round(float(probs[i, c]), 4),
            }
        )
    lines = [json.dumps(r, ensure_ascii=False) + "\n" for r in train + added]
    derive(data, args.out, {f"tncc/{TRAIN}": "".join(lines)})
    per_class = Counter(r["label"] for r in added)
    sources = Counter(r["source"] for r in added)
    conf = np.array([r["confidence"] for r in added])
    print(
        f"{len(pool)} pool sentences, {len(added)} kept (confidence median "
        f"{np.median(conf):.3f}, min {conf.min():.3f}) -> {args.out}"
    )
    print("per class:", ", ".join(f"{name} {per_class[name]}" for name in labels))
    print("per source:", ", ".join(f"{k} {v}" for k, v in sources.most_common()))


if __name__ == "__main__":
    run_script(main)
