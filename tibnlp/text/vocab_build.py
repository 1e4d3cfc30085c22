"""`tibnlp vocab build`: train the SentencePiece unigram model on a prepared corpus, report it.

The train split's sentences are streamed to SentencePiece (`sentence_iterator`), which samples
`input_sentence_size` of them (shuffled) when the corpus is larger. Our own normaliser has
already run at corpus preparation, so SentencePiece's default NFKC (which would rewrite some
Tibetan compatibility characters differently from `normalize`) is replaced by identity, plus
the syllable and punctuation rules of `tibnlp.text.spm_units` (which also seeds whole
units). The output is written to a temporary sibling folder and renamed, so a failed build
leaves nothing behind.

Progress (`progress(stage, done, total)`) counts the sentences as SentencePiece reads them and
then its EM rounds, read from its own log (`tibnlp.text.spm_log`). The log level changes no
model byte.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import sentencepiece as spm

from tibnlp.config.core import dump_yaml, to_dict
from tibnlp.config.text import VocabConfig
from tibnlp.errors import DataError
from tibnlp.fsutil import check_new_folder, staged_dir
from tibnlp.stopping import ctrl_c_as_stop
from tibnlp.text.special import PAD_ID, UNK_ID
from tibnlp.text.spm_log import Progress, TrainLog, c_stderr
from tibnlp.text.spm_units import PUNCTUATION, normalization_rules, seed_size, unit_seeds
from tibnlp.text.syllables import count_syllables, syllables
from tibnlp.text.vocab import MARKER, MODEL_FILE, WORD_START, Vocabulary

_TOO_BIG_RE = re.compile(r"<=\s*(\d+)")
_TOO_SMALL_RE = re.compile(r"smaller than required_chars\. \d+ vs (\d+)")
_EVERY = 10_000  # sentences between two progress calls


def _sentences(split: Any) -> Iterator[str]:
    for batch in split.iter(batch_size=1000):
        for sentences in batch["sentences"]:
            yield from (s for s in sentences if s.strip())


def _too_long(split: Any, max_bytes: int) -> tuple[int, int]:
    """(sentences longer than `max_bytes` UTF-8 bytes, the longest's bytes), from the Arrow
    column (no pass in Python): SentencePiece skips such sentences without a word."""
    import pyarrow.compute as pc

    lengths = pc.binary_length(pc.list_flatten(split.data.column("sentences")))
    if len(lengths) == 0:
        return 0, 0
    over = pc.sum(pc.greater(lengths, max_bytes)).as_py() or 0
    return int(over), int(pc.max(lengths).as_py() or 0)


def _count_sentences(split: Any) -> int | None:
    """The split's sentences, from the Arrow list offsets (no pass over the text): the
    "reading" total. None where the table does not say."""
    import pyarrow.compute as pc

    try:
        return int(pc.sum(pc.list_value_length(split.data.column("sentences"))).as_py() or 0)
    except Exception:  # an estimate for a progress bar is never worth a failed build
        return None


class _Feed:
    """`sentences`, counted for `progress` every `_EVERY`. An exception raised while reading
    them (Ctrl-C, a damaged Arrow file) is kept in `error`: SentencePiece's binding turns it
    into a RuntimeError "INTERNAL: KeyboardInterrupt", and `_train` re-raises it as itself."""

    def __init__(
        self, sentences: Iterable[str], stage: str, total: int | None, progress: Progress | None
    ) -> None:
        self.sentences, self.stage, self.total, self.progress = sentences, stage, total, progress
        self.error: BaseException | None = None

    def __iter__(self) -> Iterator[str]:
        done = 0
        try:
            for done, sentence in enumerate(self.sentences, 1):
                if self.progress is not None and done % _EVERY == 0:
                    self.progress(self.stage, done, self.total)
                yield sentence
        except GeneratorExit:
            raise
        except BaseException as exc:
            self.error = exc
            raise
        if self.progress is not None:
            self.progress(self.stage, done, self.total)


def _threads(config: VocabConfig) -> int:
    return config.num_threads or os.cpu_count() or 1


def _train(
    config: VocabConfig,
    sentences: Iterable[str],
    workdir: Path,
    seeds: Path | None = None,
    progress: Progress | None = None,
    total: int | None = None,
) -> bytes:
    """The canonical model bytes; `progress` sees the sentences read (of `total`) and the EM
    rounds (no round without fd 2 to read SentencePiece's log from)."""
    model = io.BytesIO()
    feed = _Feed(sentences, "reading", total, progress)
    log = TrainLog(progress, config.vocab_size) if progress is not None else None
    rules: dict[str, Any] = {"normalization_rule_name": "identity"}
    if table := normalization_rules(config):
        tsv = workdir / "syllable_rules.tsv"
        tsv.write_text("".join(f"{k}\t{v}\n" for k, v in table.items()))
        rules = {"normalization_rule_tsv": str(tsv)}
    if config.punctuation_pieces:
        rules["required_chars"] = "".join(PUNCTUATION)
    if seeds is not None:
        rules["seed_sentencepieces_file"] = str(seeds)
    spm.set_random_generator_seed(config.seed)  # sampling and shuffling are reproducible
    capture = c_stderr(log) if log is not None else contextlib.nullcontext(False)
    # one C call of minutes: a Ctrl-C in it is taken within TAKE_S, not after its end
    with capture as logged, ctrl_c_as_stop():
        try:
            spm.SentencePieceTrainer.train(
                **rules,
                **_spec(config),
                sentence_iterator=iter(feed),
                model_writer=model,
                minloglevel=0 if logged else 2,
            )
        except (RuntimeError, ValueError) as exc:
            if feed.error is not None:  # raised by reading the corpus, not by SentencePiece
                raise feed.error from None
            raise _train_error(config, str(exc)) from exc
        finally:
            if logged:  # a global: later encoding stays quiet, as before
                with contextlib.suppress(AttributeError):
                    spm.set_min_log_level(2)
    if log is not None:
        log.finish()
    return _canonical(model.getvalue())


def _spec(config: VocabConfig) -> dict[str, Any]:
    """SentencePiece's settings other than the input, the rules and the log level."""
    specials = config.special_tokens
    return {
        "model_type": "unigram",
        "vocab_size": config.vocab_size,
        "character_coverage": config.character_coverage,
        "input_sentence_size": config.input_sentence_size,
        "shuffle_input_sentence": True,
        "max_sentence_length": config.max_sentence_length,
        "num_threads": _threads(config),
        "seed_sentencepiece_size": seed_size(config),
        "pad_id": PAD_ID,
        "pad_piece": specials[0],
        "unk_id": UNK_ID,
        "unk_piece": specials[1],
        "bos_id": -1,
        "eos_id": -1,
        "control_symbols": specials[2:],
        "hard_vocab_limit": config.hard_limit,
        "split_by_whitespace": not config.cross_syllables,
    }


def _train_error(config: VocabConfig, text: str) -> DataError:
    """SentencePiece's failure as what to change."""
    if small := _TOO_SMALL_RE.search(text):  # not "too high": the advice is the opposite
        return DataError(
            f"vocabulary size {config.vocab_size} is below the {small.group(1)} characters "
            "and special pieces the corpus needs "
            f"(vocab.character_coverage={config.character_coverage})",
            f"raise --vocab-size to at least {small.group(1)}, or lower "
            "vocab.character_coverage (down to 0.98) to leave rare characters out as [UNK]",
        )
    if "Vocabulary size" in text or "vocab_size" in text:
        found = _TOO_BIG_RE.search(text)
        most = f"~{found.group(1)}" if found else "fewer"
        hint = "lower --vocab-size (or use a larger corpus)"
        if config.split_on_tsheg and not config.cross_syllables:
            hint += (
                "; pieces stay inside syllables (vocab.split_on_tsheg), so the corpus's "
                "syllable inventory bounds the size (vocab.cross_syllables=true lifts it)"
            )
        return DataError(
            f"vocabulary size {config.vocab_size}: the corpus supports at most {most} pieces",
            hint,
        )
    return DataError(f"SentencePiece could not train: {text.strip()}")


def _canonical(proto: bytes) -> bytes:
    """The model without the settings that name this machine (the rules file's temporary path,
    the thread count), so that the same corpus, config and SentencePiece version give the same
    bytes and sha256 wherever they are built; encoding reads neither (the rules live in the
    compiled charsmap). The version matters: 0.2.2 and 0.2.3 built 27,236 and 19,558 pieces
    from the same nine corpora, so the report names it."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    model = pb.ModelProto()  # type: ignore[attr-defined]  # generated module, no stubs
    model.ParseFromString(proto)
    model.normalizer_spec.ClearField("normalization_rule_tsv")
    model.trainer_spec.ClearField("num_threads")
    model.trainer_spec.ClearField("seed_sentencepieces_file")  # a temporary path
    return model.SerializeToString(deterministic=True)


def _sha256(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def evaluate(vocab: Vocabulary, sentences: list[str]) -> dict[str, Any]:
    """Held-out figures: [UNK] share, pieces per syllable, coverage of syllable types."""
    ids = vocab.encode_batch(sentences)
    n_pieces = sum(len(x) for x in ids)
    n_unk = sum(x.count(vocab.unk_id) for x in ids)
    n_syll = sum(count_syllables(s) for s in sentences)
    types = Counter(syl for s in sentences for syl in syllables(s))
    encoded = vocab.encode_batch(list(types))
    single = known = single_tokens = known_tokens = 0
    for (_syl, count), type_ids in zip(types.items(), encoded, strict=True):
        type_ids = [p for p in type_ids if vocab.id_to_piece(p) != WORD_START]
        if vocab.unk_id not in type_ids:
            known += 1
            known_tokens += count
        if len(type_ids) == 1 and type_ids[0] != vocab.unk_id:
            single += 1
            single_tokens += count
    n_types, n_tokens = len(types) or 1, sum(types.values()) or 1
    regular = (i for i in range(vocab.size) if i not in vocab.special_ids and i != vocab.unk_id)
    pieces = [vocab.id_to_piece(i) for i in regular]
    return {
        "heldout_sentences": len(sentences),
        "heldout_pieces": n_pieces,
        "heldout_syllables": n_syll,
        "unk_share": n_unk / max(n_pieces, 1),
        "pieces_per_syllable": n_pieces / max(n_syll, 1),
        "syllable_types": len(types),
        "syllable_type_coverage": known / n_types,  # types encoded without [UNK]
        "syllable_type_single_piece": single / n_types,  # types that are one piece
        "syllable_token_single_piece": single_tokens / n_tokens,
        "syllable_token_coverage": known_tokens / n_tokens,
        "multi_syllable_pieces": sum(p.count(WORD_START) > 1 for p in pieces),  # cross_syllables
        "longest_pieces": sorted(pieces, key=lambda p: (-len(p.lstrip(WORD_START)), p))[:20],
    }


def build_vocabulary(
    corpus_dir: Path,
    output_dir: Path,
    config: VocabConfig,
    progress: Progress | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Train, evaluate on the held-out split and write the vocabulary folder; returns the report.
    `progress(stage, done, total)`: see `Progress`. With `force`, an earlier vocabulary folder
    at `output_dir` is replaced once the new one is complete (any other folder is refused)."""
    config.validate("vocab")  # a config built in code, not read: SentencePiece's bounds
    corpus_dir, output_dir = Path(corpus_dir), Path(output_dir)
    replace = force and (output_dir / MARKER).is_file()
    if not replace:
        check_new_folder(
            output_dir,
            f"it is no vocabulary folder (it has no {MARKER}): choose a new --output"
            if force
            else "choose a new --output, or pass --force to replace that vocabulary",
        )
    from tibnlp.text.prepared import load_prepared  # (datasets: imported when needed)

    corpus = load_prepared(corpus_dir)  # (or a DataError saying how to make one)
    if "train" not in corpus or "heldout" not in corpus:
        raise DataError(f"{corpus_dir}: the prepared corpus lacks a train or heldout split")
    train = corpus["train"]
    first = next(_sentences(train), None)
    if first is None:
        raise DataError(f"{corpus_dir}: the train split has no sentences; nothing to learn from")
    total = _count_sentences(train)
    too_long, longest = _too_long(train, config.max_sentence_length)
    if total is not None and too_long >= total:
        raise DataError(
            f"{corpus_dir}: all {total} train sentence(s) are longer than "
            f"vocab.max_sentence_length={config.max_sentence_length} bytes (the longest: "
            f"{longest:,}), and SentencePiece skips such sentences: nothing is left to learn from",
            f"raise it (--set vocab.max_sentence_length={longest}), or give the text shads "
            "(a sentence ends at a shad) or line breaks before `tibnlp corpus prepare`",
        )
    # staged before training, not after: an output folder that cannot be made fails in
    # seconds, not after the minutes of training (a failure still leaves nothing behind)
    with staged_dir(output_dir, replace) as tmp, tempfile.TemporaryDirectory() as workdir:
        seeds = None
        if config.whole_units:
            seeds = Path(workdir) / "seeds.tsv"
            unit_seeds(config, _Feed(_sentences(train), "units", total, progress), seeds)
        proto = _train(config, _sentences(train), Path(workdir), seeds, progress, total)
        if progress is not None:
            progress("evaluating", 0, None)
        vocab = Vocabulary(proto)
        heldout = list(_sentences(corpus["heldout"]))
        report: dict[str, Any] = {
            "vocab_size": vocab.size,
            "requested_vocab_size": config.vocab_size,
            "split_on_tsheg": config.split_on_tsheg,
            "punctuation_pieces": config.punctuation_pieces,
            "whole_units": config.whole_units,
            "cross_syllables": config.cross_syllables,
            "sha256": vocab.sha256,
            "sentencepiece": spm.__version__,
            "num_threads": _threads(config),
            "corpus": str(corpus_dir.resolve()),
            # train sentences SentencePiece skipped (longer than vocab.max_sentence_length)
            "too_long_sentences": too_long,
            "longest_sentence_bytes": longest,
            **evaluate(vocab, heldout),
        }
        (tmp / MODEL_FILE).write_bytes(proto)
        (tmp / "spm.vocab").write_text(
            "".join(
                f"{vocab.sp.id_to_piece(i)}\t{vocab.sp.get_score(i)}\n" for i in range(vocab.size)
            ),
            encoding="utf-8",
        )
        dump_yaml(
            {
                "vocab": to_dict(config),
                "corpus": str(corpus_dir.resolve()),
                "corpus_report_sha256": _sha256(corpus_dir / "report.json"),
            },
            tmp / "vocab.yaml",
        )
        (tmp / "report.json").write_text(
            json.dumps(report, ensure_ascii=False, indent=2), encoding="utf-8"
        )
        (tmp / MARKER).write_text(json.dumps({"kind": "vocabulary", "version": 1}))
    return report
