"""The vocabulary's fixed special pieces and their ids: every tibnlp vocabulary is built with
them at ids 0-4 (`tibnlp.text.vocab_build`) and checked for them on load, so code that builds
model inputs without a `Vocabulary` at hand (GEMFormer's layouts, `tibnlp model memory`)
uses these names instead of literals."""

from __future__ import annotations

SPECIAL_PIECES = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = range(len(SPECIAL_PIECES))
# Never masked, predicted or kept as memory: [PAD] and the control symbols ([UNK] stands for
# text, an unseen character). A loaded `Vocabulary` also counts any further control symbols.
CONTROL_IDS = frozenset({PAD_ID, CLS_ID, SEP_ID, MASK_ID})
