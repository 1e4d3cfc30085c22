"""Train/test text overlap: which test items a model may simply have memorised.

TNCC titles repeat across splits (89 of 927 test titles occur in train), so published test
scores are partly recall of training items. We report scores on the full test split (for
comparison with papers) and on the test items whose text never occurs in train.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence


def unseen_indices(
    train_texts: Iterable[str],
    test_texts: Sequence[str],
    key: Callable[[str], str] = lambda t: t,
) -> list[int]:
    """Indices of `test_texts` whose `key(text)` does not occur among the train texts.

    `key` is the normalisation the model sees, so two spellings of one title count as one.
    """
    seen = {key(t) for t in train_texts}
    return [i for i, t in enumerate(test_texts) if key(t) not in seen]
