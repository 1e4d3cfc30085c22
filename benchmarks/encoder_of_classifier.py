"""A fine-tuned classifier's encoder as a model directory (issue 11's intermediate-task lever,
finetune_levers.md).

Intermediate-task transfer (Phang et al. 2018, "STILTs"): fine-tune on another labelled set
first, then on the target. `tibnlp finetune` starts from model directories, not from
classifiers, so this script writes the encoder of one classifier (a `seed-N` folder of a
fine-tuning run) as a model directory: its weights, `model.yaml`, the vocabulary, and the
pretraining record (tokens, FLOPs) of the model the classifier started from. The classifier's
head stays behind. `tibnlp finetune tncc --model OUT` then fine-tunes it like any
pretrained encoder. A lever measurement, not a product feature:

    python benchmarks/encoder_of_classifier.py RUN/shajiu_cls14/SYSTEM/seed-1 OUT
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tibnlp.errors import run_script
from tibnlp.models.classifier_io import load_classifier
from tibnlp.models.io import WEIGHTS, read_extra, save_pretrained
from tibnlp.models.long_documents.reading import inner_encoder
from tibnlp.text.vocab import copy_vocabulary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("classifier", type=Path, help="a classifier directory (seed-N)")
    parser.add_argument("out", type=Path, help="the model directory to write")
    args = parser.parse_args()
    model, meta = load_classifier(args.classifier)
    if meta.encoder != "albert":
        raise SystemExit(f"{args.classifier}: a TextCNN classifier has no encoder to pass on")
    # the pretraining record (tokens, FLOPs) of the model the classifier started from, so the
    # result table of the next fine-tuning still names it; plus the set this stage learnt
    source = Path(meta.source_model)
    extra = read_extra(source) if meta.source_model and (source / WEIGHTS).is_file() else {}
    extra["intermediate_dataset"] = meta.dataset
    save_pretrained(inner_encoder(model.encoder), meta.model, args.out, extra)
    copy_vocabulary(args.classifier, args.out)
    print(f"wrote {args.out}: the encoder of {args.classifier} ({meta.dataset})")


if __name__ == "__main__":
    run_script(main)
