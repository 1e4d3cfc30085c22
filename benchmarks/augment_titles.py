"""Contextual augmentation of the TNCC training titles (issue 11's lever, finetune_levers.md).

Pretraining might pay beyond the encoder's weights: a pretrained masked LM can write
plausible variants of each training title (Kobayashi 2018, "Contextual Augmentation"), which a
random-init twin cannot. This script writes a data directory whose `tncc/` training file holds
every title plus `--copies` altered copies with the same label; the other datasets are linked
from the source data directory, so `TIBNLP_DATA=OUT tibnlp finetune tncc ...` fine-tunes on it
and scores the unchanged validation and test titles.

- `--mode mlm`: `--rate` of each title's pieces (at least one) masked and refilled by sampling
  the pretrained MLM head (`--model`, a pretraining output's model folder), never the original
  piece nor a special one;
- `--mode unigram`: the same positions refilled from the training titles' piece frequencies
  (the twin's counterpart: no pretrained model).

Titles with a piece outside the vocabulary get no copies (the unknown piece would decode as a
placeholder; their draws are still made). A lever measurement, not a product feature:
finetune_levers.md has the result.

    python benchmarks/augment_titles.py --model MODEL --data DATA --out OUT --mode mlm
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from tibnlp.data.datadir import derive
from tibnlp.data.labelled import model_text
from tibnlp.errors import run_script
from tibnlp.models.memory_report import load_mlm
from tibnlp.models.pretraining import AlbertForPretraining
from tibnlp.text.special import CLS_ID, MASK_ID, SEP_ID
from tibnlp.text.vocab import Vocabulary

TRAIN = "tncc_title_train.jsonl"
MAX_PIECES = 48  # the fine-tuning read length (50) less [CLS] and [SEP]


def refill(
    model: AlbertForPretraining | None,
    unigram: torch.Tensor | None,
    rows: list[list[int]],
    rate: float,
    banned: torch.Tensor,
    g: torch.Generator,
) -> list[list[int]]:
    """One altered copy of each row of piece ids (no specials): `rate` of its pieces redrawn."""
    width = max(len(r) for r in rows) + 2
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    attention = torch.zeros_like(ids)
    pick = torch.zeros_like(ids, dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, : len(r) + 2] = torch.tensor([CLS_ID, *r, SEP_ID])
        attention[i, : len(r) + 2] = 1
        count = max(1, round(len(r) * rate))
        pick[i, torch.randperm(len(r), generator=g)[:count] + 1] = True
    original = ids[pick]
    if model is not None:
        masked = ids.masked_fill(pick, MASK_ID)
        with torch.no_grad():
            hidden = model.encoder(masked, attention, torch.zeros_like(masked)).hidden
            logits = model.mlm_logits(hidden[pick])
        logits[:, banned] = float("-inf")
        probs = logits.scatter(1, original[:, None], float("-inf")).softmax(-1)
    else:
        assert unigram is not None
        probs = unigram.expand(len(original), -1).scatter(1, original[:, None], 0.0)
    out = ids.clone()
    out[pick] = torch.multinomial(probs, 1, generator=g)[:, 0]
    return [out[i, 1 : len(r) + 1].tolist() for i, r in enumerate(rows)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True, help="pretraining model folder")
    ap.add_argument("--data", type=Path, required=True, help="source data directory")
    ap.add_argument("--out", type=Path, required=True, help="data directory to write")
    ap.add_argument("--mode", choices=["mlm", "unigram"], required=True)
    ap.add_argument("--copies", type=int, default=2)
    ap.add_argument("--rate", type=float, default=0.15)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.out.exists():
        raise SystemExit(f"{args.out} exists: choose a new --out")
    vocab = Vocabulary.load(args.model)
    source = args.data / "tncc" / TRAIN
    records = [json.loads(line) for line in source.read_text(encoding="utf-8").splitlines()]
    pieces = [vocab.encode(model_text(r["text"], "tsheg-trimmed"))[:MAX_PIECES] for r in records]
    if not all(pieces):
        raise SystemExit(f"{source}: a title encodes to no pieces")
    banned = torch.tensor(sorted(vocab.special_ids | {vocab.unk_id}))
    model, unigram = None, None
    if args.mode == "mlm":
        model, _ = load_mlm(args.model)  # refuses a folder with no MLM head
    else:
        counts = torch.zeros(vocab.size).index_add_(
            0, torch.tensor([t for p in pieces for t in p]), torch.ones(sum(map(len, pieces)))
        )
        counts[banned] = 0
        unigram = (counts / counts.sum())[None, :]
    g = torch.Generator().manual_seed(args.seed)
    added = []
    for copy in range(args.copies):
        for lo in range(0, len(pieces), 256):
            chunk = range(lo, min(lo + 256, len(pieces)))
            news = refill(model, unigram, [pieces[i] for i in chunk], args.rate, banned, g)
            for i, new in zip(chunk, news, strict=True):
                if vocab.unk_id in pieces[i]:
                    continue
                text = vocab.decode(new)
                rec = records[i]
                added.append(
                    {
                        **rec,
                        "id": f"{rec['id']}-aug{copy}",
                        "text": text,
                        "title": text,
                        "text_tsheg": text,
                    }
                )
    lines = [json.dumps(r, ensure_ascii=False) + "\n" for r in records + added]
    derive(args.data, args.out, {f"tncc/{TRAIN}": "".join(lines)})
    print(f"{len(records)} titles + {len(added)} copies ({args.mode}) -> {args.out}")


if __name__ == "__main__":
    run_script(main)
