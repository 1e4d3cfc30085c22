"""Fine-tuning levers for a pretrained encoder: layer-wise learning-rate decay
(`finetune.layer_decay`), the MLM kept beside the classification loss
(`finetune.mlm_weight`, `tibnlp.training.aux_mlm`), and adversarial batches
(`finetune.adversarial`, run end to end here; its parts in test_adversarial.py)."""

from __future__ import annotations

import json
import random
import shutil
from unittest import mock

import pytest
import torch
from safetensors.torch import load_file

from tests.ft_fixtures import (
    LABELS,
    TINY_MODEL,
    make_data_dir,
    make_model_dir,
    make_title,
    make_vocab,
)
from tibnlp.config import load_config
from tibnlp.data.collate import SampledSegmentation, pad_batch
from tibnlp.data.input_mask import InputMasker
from tibnlp.data.masking import IGNORE_INDEX
from tibnlp.errors import ConfigError, DataError
from tibnlp.models.io import save_pretrained
from tibnlp.models.pretraining import AlbertForPretraining
from tibnlp.text.vocab import Vocabulary
from tibnlp.training import finetune as ft_mod
from tibnlp.training import finetune_seeds as seeds_mod
from tibnlp.training.aux_mlm import HEAD_KEYS, TokenMasker
from tibnlp.training.classification import ClassifierLoss
from tibnlp.training.finetune import run_finetune

DEEP = [o for o in TINY_MODEL if not o.startswith("model.num_layers")] + [
    "model.num_layers=3",
    "model.share_layers=false",
    "model.norm=pre",
]


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("TIBNLP_DATA", str(make_data_dir(tmp_path / "data")))
    vocab = make_vocab(tmp_path / "vocab")
    return tmp_path, vocab


def _cfg(env, *extra: str):
    tmp, vocab = env
    return load_config(
        None,
        [
            f"finetune.vocab={vocab}",
            f"finetune.output={tmp / 'runs'}",
            "finetune.encoder=albert",
            "finetune.epochs=1",
            "finetune.batch_size=16",
            "finetune.cnn_channels=8",
            "finetune.warmup_ratio=0",
            "finetune.optimizer.lr=0.001",
            "tracking.enabled=false",
            *extra,
        ],
    )


def _pretraining_dir(env):
    """A model directory as pretraining writes it, MLM head included (no SOP head)."""
    tmp, vocab = env
    cfg = load_config(None, DEEP).model
    cfg.vocab_size = Vocabulary.load(vocab).size
    out = tmp / "pretrained-mlm"
    torch.manual_seed(5)
    save_pretrained(AlbertForPretraining(cfg, sop=False), cfg, out)
    for f in vocab.iterdir():
        shutil.copy2(f, out / f.name)
    return out


def test_token_masker_masks_real_pieces_only_and_repeats() -> None:
    special = {0, 2, 3, 4}  # [PAD] [CLS] [SEP] [MASK]
    masker = TokenMasker(50, 4, special, prob=0.3, seed=7)
    ids = torch.tensor([[2, *range(10, 30), 3], [2, 11, 12, 3] + [0] * 18])
    mask = (ids != 0).long()
    masked, labels = masker(ids, mask, key=3)
    chosen = labels != IGNORE_INDEX
    assert torch.equal(labels[chosen], ids[chosen])  # the original piece is the target
    assert not chosen[torch.isin(ids, torch.tensor(sorted(special)))].any()
    assert chosen.sum(1).tolist() == [6, 1]  # round(20 * 0.3); at least one in a short text
    assert torch.equal(masked[~chosen], ids[~chosen])  # nothing else changes
    assert (masked[chosen] == 4).float().mean() > 0.5  # mostly [MASK]
    again = masker(ids, mask, key=3)
    assert torch.equal(again[0], masked) and torch.equal(again[1], labels)
    other = masker(ids, mask, key=4)[1]
    assert not torch.equal(other != IGNORE_INDEX, chosen)


def test_layer_decay_gives_lower_layers_lower_rates(env, built) -> None:
    extra = ["finetune.head_lr=0.02", "finetune.layer_decay=0.5", *DEEP]
    run_finetune(_cfg(env, *extra), "tncc")
    model, optimizer = built[-1]
    rate = {id(p): g["initial_lr"] for g in optimizer.param_groups for p in g["params"]}
    by_part: dict[str, set[float]] = {}
    for name, p in model.named_parameters():
        part = ".".join(name.split(".")[2:4]) if "later_layers" in name else name.split(".")[2]
        by_part.setdefault(part, set()).add(rate[id(p)])
    assert by_part["embeddings"] == {0.001 * 0.5**3}
    assert by_part["layer"] == {0.001 * 0.5**2}  # layer 1 of 3
    assert by_part["later_layers.0"] == {0.001 * 0.5}
    assert by_part["later_layers.1"] == {0.001}  # the last layer at the encoder's rate
    assert by_part["final_norm"] == {0.001}
    assert by_part["convs"] == by_part["out"] == {0.02}
    # an explicit embedding rate wins over the decay
    run_finetune(_cfg(env, *extra, "finetune.embedding_lr=0.003", "finetune.seeds=[2]"), "tncc")
    model, optimizer = built[-1]
    rate = {id(p): g["initial_lr"] for g in optimizer.param_groups for p in g["params"]}
    assert rate[id(dict(model.named_parameters())["model.encoder.embeddings.word.weight"])] == 0.003


def test_layer_decay_puts_memory_tokens_at_the_embedding_depth() -> None:
    """`model.memory_tokens`: learned input states of layer 1, pretrained with the encoder.
    Under layer decay they had no prefix and trained at the top rate (optimizer.lr), above
    every layer they feed; they decay as the embedding layer does."""
    from tibnlp.models.classifier import Classifier, head_config
    from tibnlp.models.encoder import Encoder
    from tibnlp.training.classification import learning_rates
    from tibnlp.training.optim import param_groups

    cfg = load_config(
        None,
        [
            *DEEP,
            "model.vocab_size=40",
            "model.memory_tokens=2",
            "finetune.layer_decay=0.5",
            "finetune.head_lr=0.02",
            "finetune.embedding_lr=0.003",  # the embedding layer's own: not the tokens'
            "finetune.optimizer.lr=0.001",
            "finetune.cnn_channels=8",
        ],
    )
    model = ClassifierLoss(Classifier(Encoder(cfg.model), 3, head_config(cfg.finetune, cfg.model)))
    groups = param_groups(model, 0.01, learning_rates(model.model, cfg.finetune))
    rate = {id(p): g.get("lr", 0.001) for g in groups for p in g["params"]}
    named = dict(model.named_parameters())
    assert rate[id(named["model.encoder.memory_tokens.states"])] == 0.001 * 0.5**3
    assert rate[id(named["model.encoder.embeddings.word.weight"])] == 0.003


def test_layer_decay_refused_for_shared_layers_and_out_of_range(env) -> None:
    shared = [*TINY_MODEL, "model.share_layers=true", "finetune.layer_decay=0.8"]
    with pytest.raises(ConfigError, match=r"finetune.layer_decay.*share_layers"):
        run_finetune(_cfg(env, *shared), "tncc")
    for bad in ("0", "1.5"):
        with pytest.raises(ConfigError, match=r"finetune.layer_decay"):
            load_config(None, [f"finetune.layer_decay={bad}"])


def test_mlm_beside_finetuning_starts_from_the_pretrained_head(env, built) -> None:
    model_dir = _pretraining_dir(env)
    cfg = _cfg(env, f"finetune.model={model_dir}", "finetune.vocab=", "finetune.mlm_weight=0.5")
    setup = ft_mod.prepare(cfg, ft_mod.load_classification("tncc", "title"))
    aux = ft_mod._aux_mlm(setup, cfg.finetune, 1)
    assert aux is not None
    saved = load_file(str(model_dir / "model.safetensors"))
    head = aux[0].state_dict()
    assert all(torch.equal(head[k], saved[k]) for k in HEAD_KEYS)

    result = run_finetune(cfg, "tncc")
    wrapper = built[-1][0]
    assert isinstance(wrapper, ClassifierLoss) and wrapper.mlm_head is not None
    names = {n for n, _ in wrapper.named_parameters()}
    assert "mlm_head.mlm_dense.weight" in names  # trained beside the classifier
    # the MLM head is a training aid: the saved classifier holds the encoder and head only
    classifier = load_file(str(result.seeds[0].directory / "model.safetensors"))
    assert not [k for k in classifier if "mlm" in k]
    assert result.seeds[0].metrics["test"].count == 30


def test_mlm_loss_is_added_with_its_weight(env) -> None:
    model_dir = _pretraining_dir(env)
    cfg = _cfg(env, f"finetune.model={model_dir}", "finetune.vocab=", "finetune.mlm_weight=0.5")
    setup = ft_mod.prepare(cfg, ft_mod.load_classification("tncc", "title"))
    head, masker = ft_mod._aux_mlm(setup, cfg.finetune, 1) or (None, None)
    assert masker is not None
    classifier = ft_mod.build_classifier(setup.meta).eval()
    wrapper = ClassifierLoss(classifier, head, 0.5).eval()
    from tibnlp.data.collate import pad_batch

    ids, mask = pad_batch(setup.ids["train"][:8])
    labels = torch.tensor(setup.data.targets("train")[:8])
    mlm_ids, mlm_labels = masker(ids, mask, 0)
    out = wrapper(ids, mask, labels, mlm_ids, mlm_labels)
    plain = ClassifierLoss(classifier)(ids, mask, labels)
    assert torch.allclose(out["classification_loss"], plain["loss"])
    assert torch.allclose(out["loss"], plain["loss"] + 0.5 * out["mlm_loss"])
    assert 0.0 <= float(out["mlm_accuracy"]) <= 1.0
    # texts without a single piece ([CLS] [SEP] only): the classification loss alone
    empty = torch.tensor([[2, 3]] * 2)
    nothing = masker(empty, torch.ones_like(empty), 1)
    assert (nothing[1] == IGNORE_INDEX).all()
    alone = wrapper(empty, torch.ones_like(empty), labels[:2], *nothing)
    assert "mlm_loss" not in alone and torch.isfinite(alone["loss"])


def test_mlm_beside_a_random_twin_and_without_a_head(env) -> None:
    tmp, vocab = env
    encoder_only = make_model_dir(tmp, vocab)  # weights of the encoder alone
    # the random-init twin trains a fresh head: no head needs to be on disk
    twin = _cfg(
        env,
        f"finetune.model={encoder_only}",
        "finetune.vocab=",
        "finetune.init=random",
        "finetune.mlm_weight=1",
    )
    assert run_finetune(twin, "tncc").seeds[0].metrics["test"].count == 30
    pretrained = _cfg(env, f"finetune.model={encoder_only}", "finetune.vocab=")
    pretrained.finetune.mlm_weight = 1.0
    with pytest.raises(DataError, match=r"no MLM head"):
        run_finetune(pretrained, "tncc")
    with pytest.raises(ConfigError, match=r"finetune.mlm_weight"):
        load_config(None, ["finetune.encoder=none", "finetune.mlm_weight=1"])
    with pytest.raises(ConfigError, match=r"finetune.mlm_prob"):
        load_config(None, ["finetune.mlm_prob=1"])


def test_new_settings_keep_earlier_seed_fingerprints(env) -> None:
    """Seeds fine-tuned before these settings existed are reused at their defaults: the
    settings enter the hashed key only when set."""
    cfg = _cfg(env, *TINY_MODEL)
    setup = ft_mod.prepare(cfg, ft_mod.load_classification("tncc", "title"))

    def hashed(*extra: str) -> dict:
        with mock.patch.object(seeds_mod.json, "dumps", wraps=json.dumps) as spy:
            seeds_mod.seed_fingerprint(setup, _cfg(env, *TINY_MODEL, *extra), 1, False)
        return spy.call_args.args[0]["finetune"]

    new = {"layer_decay", "mlm_weight", "mlm_prob", "static_vectors", "class_balance"}
    new |= {"adversarial", "subword_alpha", "subword_nbest", "l2sp", "input_mask"}
    assert not new & set(hashed()) and "optimizer" in hashed()
    assert not new & set(hashed("finetune.layer_decay=1", "finetune.mlm_prob=0.15"))
    assert hashed("finetune.mlm_weight=0.5")["mlm_weight"] == 0.5
    assert hashed("finetune.layer_decay=0.8")["layer_decay"] == 0.8
    assert hashed("finetune.class_balance=0.5")["class_balance"] == 0.5
    assert hashed("finetune.adversarial=0.1")["adversarial"] == 0.1
    assert hashed("finetune.subword_alpha=0.3")["subword_alpha"] == 0.3
    assert hashed("finetune.l2sp=0.01")["l2sp"] == 0.01
    assert hashed("finetune.input_mask=0.1")["input_mask"] == 0.1


def test_static_size_enters_the_seed_key_only_when_there_is_a_channel(env) -> None:
    cfg = _cfg(env, *TINY_MODEL)
    setup = ft_mod.prepare(cfg, ft_mod.load_classification("tncc", "title"))
    with mock.patch.object(seeds_mod.json, "dumps", wraps=json.dumps) as spy:
        seeds_mod.seed_fingerprint(setup, cfg, 1, False)
    assert "static_size" not in spy.call_args.args[0]["meta"]["head"]
    setup.meta.head.static_size = 6
    with mock.patch.object(seeds_mod.json, "dumps", wraps=json.dumps) as spy:
        seeds_mod.seed_fingerprint(setup, cfg, 1, False)
    assert spy.call_args.args[0]["meta"]["head"]["static_size"] == 6


def test_finetune_runs_with_adversarial_batches_and_names_the_system(env, built) -> None:
    result = run_finetune(_cfg(env, *TINY_MODEL, "finetune.adversarial=0.05"), "tncc")
    assert result.system.endswith("+adv0.05")
    wrapper = built[-1][0]
    assert isinstance(wrapper, ClassifierLoss) and wrapper.adversarial == 0.05
    assert result.seeds[0].metrics["test"].count == 30


def test_sampled_segmentations_spell_the_same_text_and_repeat_by_seed(env) -> None:
    """Subword regularization re-splits a text, never changes it; a seed fixes the draw."""
    _, vocab_dir = env
    vocab = Vocabulary.load(vocab_dir)
    texts = [make_title(i % len(LABELS), random.Random(i)) for i in range(40)]
    best = [vocab.encode(t) for t in texts]
    drawn = vocab.sample(texts, alpha=0.1, nbest=-1, seed=7)
    assert drawn == vocab.sample(texts, alpha=0.1, nbest=-1, seed=7)
    assert drawn != vocab.sample(texts, alpha=0.1, nbest=-1, seed=8)
    assert drawn != best  # at this smoothing some text is split otherwise
    assert [vocab.decode(d) for d in drawn] == [vocab.decode(b) for b in best]
    rows = SampledSegmentation(vocab, texts, 6, 0.1, -1, seed=1)([0, 3], key=5)
    assert rows == SampledSegmentation(vocab, texts, 6, 0.1, -1, seed=1)([0, 3], key=5)
    assert all(len(r) <= 6 and r[0] == vocab.cls_id and r[-1] == vocab.sep_id for r in rows)


def test_finetune_reads_training_batches_resegmented_but_scores_the_best(env) -> None:
    calls: list[int] = []
    real = SampledSegmentation.__call__

    def spy(self, indices, key):
        calls.append(len(indices))
        return real(self, indices, key)

    extra = ["finetune.subword_alpha=0.2", "finetune.subword_nbest=8", "finetune.probe_epochs=1"]
    with mock.patch.object(SampledSegmentation, "__call__", spy):
        result = run_finetune(_cfg(env, *TINY_MODEL, *extra), "tncc")
    assert "+sw0.2" in result.system
    # one epoch of 16-text batches after a probe that reads the best segmentation
    per_epoch = len(ft_mod.load_classification("tncc", "title").splits["train"]) // 16
    assert calls == [16] * per_epoch
    assert result.seeds[0].metrics["test"].count == 30


def test_subword_settings_are_checked_at_load(env) -> None:
    with pytest.raises(ConfigError, match=r"finetune.subword_alpha"):
        load_config(None, ["finetune.subword_alpha=-0.1"])
    with pytest.raises(ConfigError, match=r"finetune.subword_nbest"):
        load_config(None, ["finetune.subword_nbest=1"])
    with pytest.raises(ConfigError, match=r"long_document 'truncate'"):
        load_config(
            None,
            [
                "finetune.subword_alpha=0.2",
                "finetune.task=document",
                "finetune.long_document=segments",
            ],
        )


def test_l2sp_pulls_the_encoder_toward_its_start_and_leaves_the_head_free(env) -> None:
    """L2-SP's penalty is l2sp/2 x the squared distance of the encoder's trainable weights
    from the main phase's start: 0 there, its gradient l2sp x (w - w0), none on the head; the
    anchors are never saved with the classifier."""
    from tests.test_adversarial import _batch, _tiny_albert

    model = _tiny_albert()
    wrapper = ClassifierLoss(model, l2sp=0.5)
    assert not any("_l2sp_" in k for k in wrapper.state_dict())
    ids, mask, labels = _batch()
    clean = ClassifierLoss(model)(ids, mask, labels)["loss"]
    out = wrapper(ids, mask, labels)
    torch.testing.assert_close(out["l2sp_loss"], torch.tensor(0.0))
    torch.testing.assert_close(out["loss"], clean)
    word = model.encoder.embeddings.word.weight
    with torch.no_grad():
        word[5] += 2.0  # a row moved by 2.0 in each of its components
    model.zero_grad()
    out = wrapper(ids, mask, labels)
    dim = word.shape[1]
    torch.testing.assert_close(out["l2sp_loss"], torch.tensor(0.5 * 0.5 * 4.0 * dim))
    out["loss"].backward()
    grad_with = word.grad[5].clone()
    model.zero_grad()
    ClassifierLoss(model)(ids, mask, labels)["loss"].backward()
    torch.testing.assert_close(grad_with - word.grad[5], torch.full((dim,), 0.5 * 2.0))
    wrapper.eval()
    assert "l2sp_loss" not in wrapper(ids, mask, labels)  # evaluation: the plain loss


def test_finetune_with_l2sp_stays_nearer_the_pretrained_weights(env, built) -> None:
    """The same fine-tuning with a strong L2-SP ends with the encoder nearer its start, and
    the system is named by it; the LP-FT probe (a frozen encoder) runs without it."""
    start = _pretraining_dir(env)
    base = [*DEEP, f"finetune.model={start}", "finetune.probe_epochs=1", "finetune.epochs=2"]

    def drift(*extra: str) -> float:
        built.clear()
        result = run_finetune(_cfg(env, *base, *extra), "tncc")
        wrappers = [w for w, *_ in built if isinstance(w, ClassifierLoss)]
        assert [w.l2sp for w in wrappers] == [0.0, float(dict(
            x.split("=") for x in extra).get("finetune.l2sp", 0))]  # fmt: skip
        weights = load_file(str(result.seeds[0].directory / "model.safetensors"))
        pretrained = load_file(str(start / "model.safetensors"))
        shared = [k for k in pretrained if "encoder." + k in weights or k in weights]
        assert shared, "no encoder weight found in both files"
        return sum(
            float(((weights.get("encoder." + k, weights.get(k)) - pretrained[k]) ** 2).sum())
            for k in shared
        )

    free, anchored = drift(), drift("finetune.l2sp=100")
    assert anchored < 0.5 * free


def test_input_masker_hides_real_pieces_only_and_repeats() -> None:
    """[MASK] replaces only real pieces (never [CLS], [SEP], padding or a control id), at about
    the asked rate, and a (seed, batch key) pair fixes the draw."""
    rows = [[2, *range(10, 40), 3], [2, 11, 12, 3]]  # [CLS]=2, [SEP]=3, [MASK]=4
    ids, mask = pad_batch(rows)
    masker = InputMasker(mask_id=4, special_ids={0, 1, 2, 3}, prob=0.3, seed=1)
    hidden = masker(ids, mask, key=7)
    assert torch.equal(hidden, masker(ids, mask, key=7))
    assert not torch.equal(hidden, masker(ids, mask, key=8))
    changed = hidden != ids
    assert torch.all(hidden[changed] == 4)
    assert not changed[:, 0].any() and not changed[mask == 0].any()
    assert not changed[0, 31] and not changed[1, 3]  # the [SEP]s
    draws = InputMasker(4, {0, 1, 2, 3}, 0.3, seed=2)
    ids = torch.randint(10, 100, (64, 50))
    share = (draws(ids, torch.ones_like(ids), key=0) == 4).float().mean().item()
    assert 0.25 < share < 0.35
    with pytest.raises(ValueError, match="input mask"):
        InputMasker(4, {0}, 1.0, seed=1)


def test_finetune_hides_pieces_in_training_batches_only(env) -> None:
    """With finetune.input_mask, the main phase's training batches carry [MASK]s; the LP-FT
    probe's batches and every scored split read the text whole; the system says so."""
    seen: list[torch.Tensor] = []
    real = InputMasker.__call__

    def spy(self, input_ids, attention_mask, key):  # type: ignore[no-untyped-def]
        out = real(self, input_ids, attention_mask, key)
        seen.append(out)
        return out

    extra = ["finetune.input_mask=0.25", "finetune.probe_epochs=1"]
    with mock.patch.object(InputMasker, "__call__", spy):
        result = run_finetune(_cfg(env, *TINY_MODEL, *extra), "tncc")
    assert "+mask0.25" in result.system
    per_epoch = len(ft_mod.load_classification("tncc", "title").splits["train"]) // 16
    assert len(seen) == per_epoch  # one epoch of the main phase, none in the probe
    mask_id = Vocabulary.load(env[1]).mask_id
    assert any((batch == mask_id).any() for batch in seen)
    assert result.seeds[0].metrics["test"].count == 30


def test_input_mask_is_checked_at_load() -> None:
    with pytest.raises(ConfigError, match=r"finetune.input_mask"):
        load_config(None, ["finetune.input_mask=1.0"])
    with pytest.raises(ConfigError, match=r"long_document 'truncate'"):
        load_config(
            None,
            [
                "finetune.input_mask=0.1",
                "finetune.task=document",
                "finetune.long_document=segments",
            ],
        )
