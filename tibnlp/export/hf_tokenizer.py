"""A Hugging Face `tokenizers` pipeline that gives exactly `Vocabulary.encode(model_text(x))`.

Why not the stock `AlbertTokenizer`: by default it runs NFKD and strips combining marks, which
deletes Tibetan vowel signs (བོད becomes བད), and lower-cases. In transformers 5 its constructor
also rebuilds the normaliser from its own flags, so a `tokenizer.json` carrying Tibetan rules
would be ignored. The export therefore writes a complete `tokenizer.json` (loaded as is by
`PreTrainedTokenizerFast`, which `AutoTokenizer` picks from `tokenizer_config.json`) whose
normaliser is tibnlp's own, rule for rule (`tibnlp.text.normalize`, with
`join_spaced_syllables`: the form fine-tuning and `predict` feed), followed by the vocabulary's
compiled SentencePiece rules (tsheg -> whitespace) and SentencePiece's whitespace handling, and
whose model is the same unigram with the same scores. Nothing lower-cases or strips accents
(`keep_accents: true`, `do_lower_case: false` are recorded for readers of the config).

The unknown piece decodes as SentencePiece decodes it, to the vocabulary's unk surface (" ⁇ "),
not to "[UNK]": `decode` gives `Vocabulary.decode`'s text. [UNK] is therefore not a special
token in tokenizer.json (SentencePiece's control symbols, [CLS] [SEP] [PAD] [MASK], vanish
from a decoded text; the unknown piece shows where text was). transformers makes every named
special token special when it loads a tokenizer, so there `decode(skip_special_tokens=True)`
drops it, as for any of its tokenizers; without skipping it shows " ⁇ " too.
"""

from __future__ import annotations

import re
import sys
from typing import Any

from tibnlp.errors import TibnlpError
from tibnlp.text.normalize import (
    _DIGITS,
    _INVISIBLE,
    _SHAD,
    _START,
    _SYLLABLE_END,
    NBSP_TSHEG,
    TSHEG,
)
from tibnlp.text.vocab import (
    _SPACE_BEFORE_SHAD,
    WORD_START,
    Vocabulary,
    space_after_syllable,
)

SPECIAL_TOKENS = {
    "pad_token": "[PAD]",
    "unk_token": "[UNK]",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "mask_token": "[MASK]",
}


def require_tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError as exc:
        raise TibnlpError(
            "exporting to Hugging Face needs the `tokenizers` package",
            "install the extra: pip install 'tibnlp[hf]'",
        ) from exc
    return tokenizers


def _onig(chars: str) -> str:
    """A Python character-class body (ranges with '-') as an Oniguruma one (\\x{..} escapes)."""
    return "".join(c if c == "-" else f"\\x{{{ord(c):x}}}" for c in chars)


def _whitespace_class() -> str:
    """Every character Python's `\\s` matches in a str pattern (what `normalize` collapses)."""
    return "".join(f"\\x{{{c:x}}}" for c in range(sys.maxunicode + 1) if chr(c).isspace())


def tibetan_normalizers(n: Any, regex: Any) -> list[Any]:
    """`tibnlp.text.normalize.normalize(text, join_spaced_syllables=True)` as normaliser steps,
    in the same order (rule numbers of that module's docstring)."""
    shad, start, end = _onig(_SHAD), _onig(_START), _onig(_SYLLABLE_END)
    digit = f"[{_onig(_DIGITS)}]"
    number_shad = f"{digit}\\x{{f0d}}"
    return [
        n.Replace(regex(f"[{_onig(_INVISIBLE)}]+"), ""),  # 1
        n.Replace(regex(f"[{_whitespace_class()}]+"), " "),  # 3 (before 2, as _clean does)
        n.Replace(NBSP_TSHEG, TSHEG),  # 2
        n.Strip(),
        n.NFC(),  # 4
        n.Replace(regex(f"(?<=[{end}]) (?=[{start}])"), TSHEG),  # 5: TNCC's spaced syllables
        n.Replace(" " + TSHEG, TSHEG),  # 6
        n.Replace(regex(f"{TSHEG}{TSHEG}+"), TSHEG),
        n.Replace(regex(f"{TSHEG} (?=[\\x{{f40}}-\\x{{f6c}}])"), TSHEG),
        n.Replace(regex(f"(?<=[^{shad} ]) (?=[{shad}])"), ""),  # 7: no space before a shad
        # a space after it, unless it is one shad between two digits ("༡༠།༠༠")
        n.Replace(
            regex(f"(?<=[^{shad} ][{shad}]+)(?=[{start}])(?!(?<={number_shad}){digit})"), " "
        ),
    ]


def tibetan_decoder(d: Any, regex: Any, vocab: Vocabulary) -> Any:
    """`Vocabulary.decode` as a decoder: the unknown piece as SentencePiece's unk surface
    (it decoded as "[UNK]"; the tsheg rule leaves the space the surface opens with),
    SentencePiece's whitespace, then its rules on the joined text (a plain Metaspace gave
    every tsheg back as a space). The rules are the same patterns (Oniguruma reads Python's
    lookarounds and classes alike); `Fuse` first, since a decoder step sees one token at a
    time and a rule looks across two."""
    unk = re.escape(SPECIAL_TOKENS["unk_token"])
    steps = [
        d.Replace(regex(f"\\A{unk}\\z"), vocab.unk_surface),
        d.Metaspace(replacement=WORD_START, prepend_scheme="always"),
        d.Fuse(),
    ]
    if vocab.punctuation_pieces:
        steps.append(d.Replace(regex(_SPACE_BEFORE_SHAD.pattern), ""))
    if vocab.split_on_tsheg:
        steps.append(d.Replace(regex(space_after_syllable(vocab.unk_surface)), TSHEG))
    return d.Sequence(steps)


def _model_proto(vocab: Vocabulary) -> Any:
    """The vocabulary's SentencePiece `ModelProto` (its normaliser and trainer settings)."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    proto = pb.ModelProto()  # type: ignore[attr-defined]  # generated protobuf module
    proto.ParseFromString(vocab._proto)
    return proto


def _charsmap(vocab: Vocabulary) -> bytes:
    """The SentencePiece model's compiled normalisation rules (empty for identity)."""
    spec = _model_proto(vocab).normalizer_spec
    if not spec.add_dummy_prefix or not spec.remove_extra_whitespaces:
        raise TibnlpError(
            f"vocabulary {vocab.path}: SentencePiece options this export does not reproduce "
            "(add_dummy_prefix / remove_extra_whitespaces off)",
            "rebuild it with `tibnlp vocab build`",
        )
    return bytes(spec.precompiled_charsmap)


def build_tokenizer(vocab: Vocabulary) -> Any:
    """A `tokenizers.Tokenizer`: `[CLS] pieces [SEP]` with the ids tibnlp gives."""
    tk = require_tokenizers()
    n, regex = tk.normalizers, tk.Regex
    pieces = [(vocab.id_to_piece(i), float(vocab.sp.get_score(i))) for i in range(vocab.size)]
    tokenizer = tk.Tokenizer(tk.models.Unigram(pieces, unk_id=vocab.unk_id, byte_fallback=False))
    steps = tibetan_normalizers(n, regex)
    charsmap = _charsmap(vocab)
    if charsmap:
        steps.append(n.Precompiled(charsmap))
    steps += [n.Replace(regex(" {2,}"), " "), n.Strip()]  # SentencePiece's extra whitespace
    tokenizer.normalizer = n.Sequence(steps)
    tokenizer.pre_tokenizer = tk.pre_tokenizers.Metaspace(
        replacement=WORD_START, prepend_scheme="always"
    )
    tokenizer.decoder = tibetan_decoder(tk.decoders, regex, vocab)
    cls, sep = SPECIAL_TOKENS["cls_token"], SPECIAL_TOKENS["sep_token"]
    tokenizer.post_processor = tk.processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0",
        pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, vocab.cls_id), (sep, vocab.sep_id)],
    )
    unk = SPECIAL_TOKENS["unk_token"]  # not special: it decodes, as in SentencePiece
    controls = [t for t in SPECIAL_TOKENS.values() if t != unk]
    tokenizer.add_special_tokens(
        [tk.AddedToken(t, normalized=False, special=True) for t in controls]
    )
    tokenizer.add_tokens([tk.AddedToken(unk, normalized=False, special=False)])
    for name, token in SPECIAL_TOKENS.items():
        if tokenizer.token_to_id(token) != vocab.piece_to_id(token):
            raise TibnlpError(f"vocabulary {vocab.path}: {name} {token} has no fixed id")
    return tokenizer


def tokenizer_config(vocab: Vocabulary, max_len: int) -> dict[str, Any]:
    """`tokenizer_config.json`: the generic fast class, so `tokenizer.json` is used as is."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_len,
        "keep_accents": True,
        "do_lower_case": False,
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "token_type_ids", "attention_mask"],
        **SPECIAL_TOKENS,
        "tibnlp_vocabulary_sha256": vocab.sha256,
    }
