"""`tibnlp export hf`: transformers loads the model and tokenizer and computes what tibnlp does.

The vocabulary is trained here on real corpus text (news), the tokenizer is checked against
tibnlp on every TNCC test title and on held-out text from another corpus (literature), in the
forms users type; the model's hidden states and MLM logits are compared on real text.
"""

from __future__ import annotations

import json
import lzma
import shutil
import unicodedata
from itertools import islice
from pathlib import Path

import pytest
import torch
from conftest import _require_data

from tibnlp.config.model import HeadsConfig, ModelConfig, ScalesConfig
from tibnlp.config.text import CorpusConfig, VocabConfig
from tibnlp.data.labelled import model_text
from tibnlp.errors import ConfigError, DataError
from tibnlp.models.io import save_pretrained
from tibnlp.models.pretraining import AlbertForPretraining
from tibnlp.text.normalize import NBSP_TSHEG, TSHEG
from tibnlp.text.vocab import Vocabulary

transformers = pytest.importorskip("transformers", reason="needs the hf extra: tibnlp[hf]")

TOL = 1e-5  # fp32: absolute difference of hidden states and MLM logits


def _lines(path: Path, n: int) -> list[str]:
    with lzma.open(path, "rt", encoding="utf-8") as fh:
        return [line.strip() for line in islice(fh, n) if line.strip()]


@pytest.fixture(scope="module")
def vocab_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ~1000-piece vocabulary trained on the first 1,500 lines of the real news corpus."""
    from tibnlp.text.prepare import prepare_corpus
    from tibnlp.text.vocab_build import build_vocabulary

    news = _require_data("corpora/tibetan_tibettimes_news.txt.xz")
    root = tmp_path_factory.mktemp("hf_vocab")
    (root / "news.txt").write_text("\n".join(_lines(news, 1500)) + "\n", encoding="utf-8")
    cfg = CorpusConfig(num_proc=1, heldout_fraction=0.05)
    prepare_corpus([root / "news.txt"], root / "corpus", cfg, progress=False)
    build_vocabulary(root / "corpus", root / "vocab", VocabConfig(vocab_size=1000, num_threads=1))
    return root / "vocab"


@pytest.fixture(scope="module")
def heldout() -> list[str]:
    """Held-out text: literature lines (the vocabulary saw only news)."""
    return _lines(_require_data("corpora/tibetan_tibetcm_literature.txt.xz"), 300)


@pytest.fixture(scope="module")
def titles() -> list[dict]:
    path = _require_data("tncc/tncc_title_test.jsonl")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _tiny(vocab: Vocabulary, **kw: object) -> ModelConfig:
    shape: dict = {"embedding_size": 16, "hidden_size": 32, "num_layers": 3, "ffn_size": 64}
    shape.update({"max_len": 128, "heads": HeadsConfig(small=4, large=4), **kw})
    return ModelConfig(vocab_size=vocab.size, **shape)


def _model_dir(root: Path, vocab_dir: Path, cfg: ModelConfig) -> tuple[Path, AlbertForPretraining]:
    torch.manual_seed(0)
    model = AlbertForPretraining(cfg).eval()
    with torch.no_grad():  # non-trivial norms and biases, so every tensor's mapping matters
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    out = save_pretrained(model, cfg, root / "model")
    for item in vocab_dir.iterdir():
        shutil.copy2(item, out / item.name)
    return out, model


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, vocab_dir: Path):
    from typer.testing import CliRunner

    from tibnlp.cli.main import app

    root = tmp_path_factory.mktemp("hf_export")
    model_dir, model = _model_dir(root, vocab_dir, _tiny(Vocabulary.load(vocab_dir)))
    result = CliRunner().invoke(
        app, ["export", "hf", "--model", str(model_dir), "--output", str(root / "hf")]
    )
    assert result.exit_code == 0, result.output
    return root / "hf", model


def _tibnlp_ids(vocab: Vocabulary, text: str) -> list[int]:
    """What fine-tuning and `tibnlp predict` feed (tibnlp.data.collate.encode_texts)."""
    return [vocab.cls_id, *vocab.encode(model_text(text)), vocab.sep_id]


def _forms(text: str) -> dict[str, str]:
    return {
        "as stored": text,
        "NFC": unicodedata.normalize("NFC", text),
        "NFD": unicodedata.normalize("NFD", text),
        "U+0F0C": text.replace(TSHEG, NBSP_TSHEG),
        "spaced syllables": text.replace(TSHEG, " "),
    }


def _compare(tokenizer, vocab: Vocabulary, texts: list[str]) -> int:
    checked = 0
    for text in texts:
        for form, typed in _forms(text).items():
            got = tokenizer(typed)["input_ids"]
            want = _tibnlp_ids(vocab, typed)
            assert got == want, (form, typed, tokenizer.convert_ids_to_tokens(got))
            checked += 1
    return checked


def test_tokenizer_same_ids_as_tibnlp_on_tncc_test_titles(exported, vocab_dir, titles) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(exported[0])
    vocab = Vocabulary.load(vocab_dir)
    assert len(titles) == 927
    texts = [t["text"] for t in titles] + [t["text_tsheg"] for t in titles]
    assert _compare(tokenizer, vocab, texts) == 5 * 2 * 927
    for t in titles[:50]:  # the stored spaced form and the tsheg form are the same input
        assert tokenizer(t["text"])["input_ids"] == tokenizer(t["text_tsheg"])["input_ids"]


def test_tokenizer_same_ids_as_tibnlp_on_heldout_corpus_text(exported, vocab_dir, heldout) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(exported[0])
    vocab = Vocabulary.load(vocab_dir)
    assert _compare(tokenizer, vocab, heldout) == 5 * len(heldout)
    tricky = [  # the rules of tibnlp.text.normalize, each exercised once
        "བོད་ཀྱི་\u200bསྐད་ཡིག",
        "ཀ ་ ་ཁ །ག",
        "ལོ། །བདག་ཉིད",
        "ལ།དེ་ནས༎ཀ",
        "\u0f43\u0f73 ཀ\u00a0ཁ\tག\n",
        "བོད་ཀྱི་ 2024 ལོ།",
        "ཆུ་ཚོད་ ༡༠།༠༠ བའི་སྟེང་།ཀ",  # a shad inside a number keeps no space
        "ལ།༢་པ ༢༠༡༦།༠༧།༢༦",
    ]
    for text in tricky:
        assert tokenizer(text)["input_ids"] == _tibnlp_ids(vocab, text), text


def test_tokenizer_keeps_vowel_signs_and_records_its_settings(exported, vocab_dir) -> None:
    out = exported[0]
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    pieces = "".join(tokenizer.tokenize("བོད་ཀྱི་སྐད་ཡིག"))
    assert "ོ" in pieces and "ྱ" in pieces and "ི" in pieces
    config = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["keep_accents"] is True and config["do_lower_case"] is False
    # The trap the export avoids: AlbertTokenizer's default normaliser (keep_accents=False:
    # NFKD, then accents stripped) deletes the vowel sign.
    from tokenizers import normalizers

    stock = normalizers.Sequence([normalizers.NFKD(), normalizers.StripAccents()])
    assert stock.normalize_str("བོད") == "བད"
    assert tokenizer.backend_tokenizer.normalizer.normalize_str("བོད") == "བོད"


def _same_decode(decode, vocab: Vocabulary, texts: list[str]) -> int:
    """Assert `decode(ids)` is `vocab.decode`'s text for each text; the number compared. Texts
    with an unknown piece are left out: transformers skips it with the special tokens, where
    SentencePiece shows " ⁇ " (the export's decoder too: test_export_hf_unknown.py)."""
    checked = 0
    for text in texts:
        ids = _tibnlp_ids(vocab, text)
        if vocab.unk_id not in ids:
            assert decode(ids) == vocab.decode(ids[1:-1]), text
            checked += 1
    return checked


def test_decode_gives_the_text_tibnlp_decodes(exported, vocab_dir, titles, heldout) -> None:
    """The export's decoder was a plain Metaspace: every tsheg came back a space ("བོད ཀྱི
    རྒྱལ ཁབ"), in `decode`, `batch_decode` and the fill-mask pipeline's sequences."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(exported[0])
    vocab = Vocabulary.load(vocab_dir)
    ids = tokenizer("བོད་ཀྱི་རྒྱལ་ཁབ")["input_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "བོད་ཀྱི་རྒྱལ་ཁབ"
    texts = [t["text_tsheg"] for t in titles[:300]] + [h[:300] for h in heldout[:100]]
    texts += ["བོད་ཀྱི་ 2024 ལོ།", "བོད་ཀྱི་སྐད་ཡིག། ལོ། །བདག་ཉིད"]
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    assert _same_decode(decode, vocab, texts) > 100


def test_decode_drops_the_space_before_a_shad_piece(tmp_path: Path, vocab_dir, titles) -> None:
    """With `punctuation_pieces` a closing shad is a piece (`▁།`): its space goes, as
    `Vocabulary.decode` has it ("ཁབ།", not "ཁབ །")."""
    from tokenizers import Tokenizer

    from tibnlp.export.hf_tokenizer import build_tokenizer
    from tibnlp.text.vocab_build import build_vocabulary

    config = VocabConfig(vocab_size=1000, num_threads=1, punctuation_pieces=True)
    build_vocabulary(vocab_dir.parent / "corpus", tmp_path / "vocab", config)
    vocab = Vocabulary.load(tmp_path / "vocab")
    assert vocab.punctuation_pieces
    tokenizer = Tokenizer.from_str(build_tokenizer(vocab).to_str())  # as tokenizer.json has it
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    assert decode(_tibnlp_ids(vocab, "བོད་ཀྱི་རྒྱལ་ཁབ། ལོ།")) == "བོད་ཀྱི་རྒྱལ་ཁབ། ལོ།"
    texts = [t["text_tsheg"] for t in titles[:300]] + ["ང་། ཁ", "ཀ། །ཁ", "ཀ་ཁ༎ ག"]
    assert _same_decode(decode, vocab, texts) > 100


def _batch(tokenizer, texts: list[str]) -> dict[str, torch.Tensor]:
    return tokenizer(texts, padding=True, return_tensors="pt")


def test_round_trip_hidden_states_and_mlm_logits(exported, titles, heldout) -> None:
    out, model = exported
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    texts = [t["text"] for t in titles[:12]] + [h[:200] for h in heldout[:4]]
    batch = _batch(tokenizer, texts)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    real = mask.bool()
    with torch.no_grad():
        ours_h = model.encoder(ids, mask).hidden
        ours_logits = model.mlm_logits(ours_h)
        base = transformers.AutoModel.from_pretrained(out).eval()
        theirs_h = base(**batch).last_hidden_state
        mlm = transformers.AutoModelForMaskedLM.from_pretrained(out).eval()
        theirs_logits = mlm(**batch).logits
    assert ours_h.abs()[real].mean() > 0.1  # a real comparison, not of zeros
    assert torch.allclose(ours_h[real], theirs_h[real], atol=TOL, rtol=0)
    assert torch.allclose(ours_logits[real], theirs_logits[real], atol=TOL, rtol=0)
    assert (ours_logits[real].argmax(-1) == theirs_logits[real].argmax(-1)).all()


def test_fill_mask_pipeline_on_tibetan(exported) -> None:
    out, model = exported
    fill = transformers.pipeline("fill-mask", model=str(out), tokenizer=str(out), device="cpu")
    results = fill("བོད་ཀྱི་[MASK]་ཡིག", top_k=3)
    assert len(results) == 3
    tokenizer = fill.tokenizer
    ids = tokenizer("བོད་ཀྱི་[MASK]་ཡིག", return_tensors="pt")
    pos = int((ids["input_ids"][0] == tokenizer.mask_token_id).nonzero())
    with torch.no_grad():
        h = model.encoder(ids["input_ids"], ids["attention_mask"]).hidden
        best = model.mlm_logits(h)[0, pos].topk(3).indices.tolist()
    assert [r["token"] for r in results] == best


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"heads": HeadsConfig(small=2, large=4, threshold=10)}, "model.heads"),
        ({"scales": ScalesConfig(windows=["1", "3"])}, "model.scales.windows"),
        ({"position": "relative"}, "model.position"),
        ({"memory_tokens": 2}, "model.memory_tokens"),
        ({"norm": "pre"}, "model.norm"),
        ({"share_layers": False}, "model.share_layers"),
    ],
)
def test_designs_stock_albert_cannot_express_are_refused(
    tmp_path: Path, vocab_dir: Path, change: dict, key: str
) -> None:
    from tibnlp.export.hf_model import export_hf

    cfg = _tiny(Vocabulary.load(vocab_dir), **change)
    model_dir, _ = _model_dir(tmp_path, vocab_dir, cfg)
    with pytest.raises(ConfigError, match=f"config key '{key}'"):
        export_hf(model_dir, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_fusion_refused_and_encoder_only_directory_refused(tmp_path: Path, vocab_dir) -> None:
    from tibnlp.config.model import FusionConfig
    from tibnlp.export.hf_model import export_hf, unsupported

    cfg = _tiny(Vocabulary.load(vocab_dir), fusion=FusionConfig(enabled=True))
    assert [k for k, _ in unsupported(cfg)] == ["model.fusion.enabled"]
    cfg = _tiny(Vocabulary.load(vocab_dir))
    model_dir, model = _model_dir(tmp_path, vocab_dir, cfg)
    save_pretrained(model.encoder, cfg, model_dir)  # encoder weights only
    with pytest.raises(DataError, match="no MLM/SOP heads"):
        export_hf(model_dir, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
