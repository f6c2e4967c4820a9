"""Model selection inside a transfer run, and the transfer details of the BERT and GPT recipes.

- the validation split (seeded, stratified, disjoint from what trains) and early stopping with the best
  state kept; the learning-rate grid chooses on the same split; the refit trains again on every
  example, held-out ones included, for the chosen number of epochs;
- features + logreg: the fitted scikit-learn model folded into the head gives scikit-learn's own
  probabilities, and the layer and strength are chosen by cross-validation;
- GPT-1's task-token rows train while the rest of the embeddings stay frozen; the auxiliary LM weight
  defaults to 0.5; ``--pool pooler`` reads BERT's tanh pooler; a BERT pretrained without next-sentence
  prediction is fine-tuned on its mean vector.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_transfer_families import rows, tiny_bert, tiny_gpt

from lmforge.data.tasks import TaskData, TextExample
from lmforge.errors import LmforgeError
from lmforge.transfer import TransferConfig, TransferRun, run_transfer
from lmforge.transfer.run import validation_split


def data(n: int, seed: int) -> TaskData:
    ex = [TextExample(r["text"], label=r["label"]) for r in rows(n, seed)]
    return TaskData("classify", ex, sorted({e.label for e in ex}))


def test_validation_split_is_seeded_stratified_and_disjoint():
    d = data(100, 3)
    fit, val = validation_split(d, 0.2, seed=5)
    assert sorted(fit + val) == list(range(100)) and not set(fit) & set(val)
    assert len(val) == 20 and validation_split(d, 0.2, seed=5) == (fit, val)
    assert validation_split(d, 0.2, seed=6)[1] != val
    share = {lab: sum(d.examples[i].label == lab for i in val) / 20 for lab in d.labels}
    whole = {lab: sum(e.label == lab for e in d.examples) / 100 for lab in d.labels}
    assert all(abs(share[k] - whole[k]) <= 0.05 for k in d.labels)
    assert validation_split(data(20, 1), 0.2, seed=0) == (list(range(20)), [])  # 4 held out: too few to choose
    assert validation_split(d, 0.0, seed=0)[1] == []


def _progress_epochs(history: list[dict]) -> list[int]:
    """The epochs that improved the validation metric or cut the least validation loss by 0.1 %."""
    out, best, least = [], -1.0, float("inf")
    for h in history:
        if h["val"] > best or h["val_loss"] < least * (1 - 1e-3):
            out.append(h["epoch"])
        best, least = max(best, h["val"]), min(least, h["val_loss"])
    return out


def _fit(tok, train: TaskData, **kw) -> dict:
    cfg = TransferConfig(task="classify", mode="finetune", lr=3e-3, epochs=30, patience=2, max_len=32, **kw)
    return TransferRun(tiny_bert(tok), cfg, train.labels).fit(train)


def test_early_stopping_keeps_the_best_epoch(wordpiece_tokenizer):
    train = data(120, 1)
    facts = _fit(wordpiece_tokenizer, train)
    ch = facts["choices"]
    assert ch["val_examples"] == 24 and 1 <= ch["best_epoch"] <= ch["epochs_run"] <= 30
    trial = [h for h in facts["history"] if not h.get("refit")]
    assert len(trial) == ch["epochs_run"]
    key = max((h["val"], -h["val_loss"]) for h in trial)  # (history rounds: equal keys are both "best")
    assert ch["best_epoch"] in [h["epoch"] for h in trial if (h["val"], -h["val_loss"]) == key]
    assert facts["val_score"] == pytest.approx(key[0], abs=1e-5) and key[0] >= 0.75
    # warm-up: 10 % of 30 epochs x 3 steps = 9 steps, the end of epoch 3; patience counts from there on
    if ch["epochs_run"] < 30:  # stopped `patience` epochs after the last progress (or the warm-up's end)
        assert ch["epochs_run"] - max(_progress_epochs(trial)[-1], 3) == 2
    # labels that mean nothing: the validation loss rises once the model memorises, so the run stops early
    noise = np.random.default_rng(0).permutation([e.label for e in train.examples])
    shuffled = TaskData("classify", [TextExample(e.text, label=str(y)) for e, y in zip(train.examples, noise)],
                        train.labels)
    facts = _fit(wordpiece_tokenizer, shuffled)
    trial = [h for h in facts["history"] if not h.get("refit")]
    assert facts["choices"]["epochs_run"] < 30 and len(trial) - max(_progress_epochs(trial)[-1], 3) == 2


def test_lr_grid_chooses_on_validation(wordpiece_tokenizer):
    body = tiny_bert(wordpiece_tokenizer)
    train, test = data(120, 1), data(48, 2)
    m = run_transfer(body, "classify", train, test, mode="frozen", lr_grid=[1e-5, 3e-2], epochs=8, max_len=32)
    trials = m["choices"]["lr_trials"]
    assert [t["lr"] for t in trials] == [1e-5, 3e-2]
    best = max(trials, key=lambda t: t["val_score"])
    assert m["choices"]["lr"] == best["lr"] and m["val_accuracy"] == pytest.approx(best["val_score"], abs=1e-5)
    # the run ends in the best trial's best state: rescoring its validation split gives the recorded score
    with pytest.raises(LmforgeError, match="validation split"):
        run_transfer(body, "classify", train, test, mode="frozen", lr_grid=[1e-3, 1e-2], val_fraction=0.0)


@pytest.mark.parametrize("mode,lr,floor", [("finetune", 3e-3, 0.9), ("frozen", 1e-2, 0.6)])
def test_refit_trains_on_every_example_for_the_chosen_epochs(wordpiece_tokenizer, mode, lr, floor):
    train, test = data(120, 1), data(48, 2)
    common = dict(mode=mode, lr=lr, epochs=30, patience=3, max_len=32, seed=0)
    kept = run_transfer(tiny_bert(wordpiece_tokenizer), "classify", train, test, refit=False, **common)
    body = tiny_bert(wordpiece_tokenizer)
    cfg = TransferConfig(task="classify", **common)
    run = TransferRun(body, cfg, train.labels)
    facts = run.fit(train)
    ch = facts["choices"]
    # the choices are the validation run's own: refitting changes none of them
    assert {k: ch[k] for k in ("val_examples", "best_epoch", "epochs_run", "lr")} == {
        k: kept["choices"][k] for k in ("val_examples", "best_epoch", "epochs_run", "lr")
    }
    assert facts["val_score"] == pytest.approx(kept["val_accuracy"], abs=1e-6)
    # the refit trains up to the later of the best-metric epoch and the least-loss epoch
    trial = [h for h in facts["history"] if not h.get("refit")]
    least_loss_epoch = min(trial, key=lambda h: h["val_loss"])["epoch"]
    n_epochs = max(ch["best_epoch"], least_loss_epoch)
    assert ch["refit"] == {"examples": 120, "epochs": n_epochs}
    refit_epochs = [h for h in facts["history"] if h.get("refit")]
    assert [h["epoch"] for h in refit_epochs] == list(range(1, n_epochs + 1))
    # all 120 examples train: 4 batches of 32 per refit epoch (the 96 fitted ones alone would be 3)
    assert facts["steps"] == 3 * ch["epochs_run"] + 4 * n_epochs
    again = TransferRun(tiny_bert(wordpiece_tokenizer), cfg, train.labels)
    again.fit(train)
    for (k, a), b in zip(run.model.state_dict().items(), again.model.state_dict().values()):
        assert torch.equal(a, b), k  # seeded: the refit is deterministic
    # the one-pass validation scores what the prediction path scores on the held-out examples
    no_refit = TransferRun(tiny_bert(wordpiece_tokenizer), TransferConfig(task="classify", refit=False, **common),
                           train.labels)
    kept_facts = no_refit.fit(train)
    held_out = train.subset(validation_split(train, 0.2, 0)[1])
    assert no_refit.score(held_out) == pytest.approx(kept_facts["val_score"], abs=1e-6)
    metrics, _ = run.evaluate(test)
    assert ch["best_epoch"] >= 2 and metrics["accuracy"] >= floor and kept["accuracy"] >= floor


def test_features_logreg_equals_scikit_learn(wordpiece_tokenizer, tmp_path):
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    body = tiny_bert(wordpiece_tokenizer)
    train, test = data(96, 1), data(48, 2)
    cfg = TransferConfig(mode="features", max_len=32, cache_dir=str(tmp_path))
    run = TransferRun(body, cfg, train.labels)
    facts = run.fit(train)
    ch = facts["choices"]
    assert set(ch["cv_accuracy_by_layer"]) == {0, 1, 2}  # embeddings + 2 layers, each cross-validated
    assert ch["layer"] == max(ch["cv_accuracy_by_layer"], key=lambda k: (ch["cv_accuracy_by_layer"][k], k))
    assert facts["val_score"] == pytest.approx(ch["cv_accuracy_by_layer"][ch["layer"]], abs=1e-4)
    # the same classifier fitted by hand on the chosen layer's mean-pooled vectors
    store_tr, store_te = run.features(train), run.features(test)
    k = run.extract_ids.index(ch["layer"])
    X_tr = store_tr.vectors[:, k].numpy()
    X_te = store_te.vectors[:, k].numpy()
    y = np.array([train.labels.index(e.label) for e in train.examples])
    sc = StandardScaler().fit(X_tr)
    ref = LogisticRegression(C=ch["C"], max_iter=2000).fit(sc.transform(X_tr), y)
    want = ref.predict_proba(sc.transform(X_te))
    got = np.array([[p["probs"][lab] for lab in train.labels] for p in run.predict(test)])
    assert np.abs(got - want).max() < 1e-4


def test_gpt_task_tokens_train_only_their_rows(bpe_tokenizer):
    train = data(40, 1)
    for mode, extra in (("frozen", {"pool": "last"}), ("finetune", {"freeze_layers": 0})):  # read at extract
        body = tiny_gpt(bpe_tokenizer)
        run = TransferRun(
            body, TransferConfig(mode=mode, epochs=2, lr=1e-2, max_len=32, val_fraction=0.0, **extra), train.labels
        )
        start, _delim, extract = run.task_token_ids  # a single text is start text extract: no delim
        ids = [start, extract]
        before = body.wte.weight.detach().clone()
        run.fit(train)
        after = body.wte.weight.detach()
        changed = (after - before).abs().sum(1) > 0
        assert changed[ids].all(), f"{mode}: the start and extract rows must train"
        assert not changed[:start].any(), f"{mode}: the vocabulary's own rows must stay frozen"


def test_gpt_aux_lm_weight_defaults_to_half(bpe_tokenizer):
    train, test = data(40, 1), data(16, 2)
    kw = dict(mode="finetune", epochs=1, lr=2e-3, max_len=32, val_fraction=0.0)
    default = run_transfer(tiny_gpt(bpe_tokenizer), "classify", train, test, **kw)
    half = run_transfer(tiny_gpt(bpe_tokenizer), "classify", train, test, lm_weight=0.5, **kw)
    off = run_transfer(tiny_gpt(bpe_tokenizer), "classify", train, test, lm_weight=0.0, **kw)
    assert (default["train_loss"], default["aux_lm_loss"]) == (half["train_loss"], half["aux_lm_loss"])
    assert default["aux_lm_loss"] > 3.0 and "aux_lm_loss" not in off  # an untrained LM loss is about ln(V)
    assert TransferConfig(mode="features").resolved("gpt").lm_weight == 0.0


def test_pool_pooler_reads_bert_tanh_pooler(wordpiece_tokenizer, bpe_tokenizer):
    body = tiny_bert(wordpiece_tokenizer)
    run = TransferRun(body, TransferConfig(mode="frozen", pool="pooler", max_len=32), ["neg", "pos"])
    run.build()
    enc = run.fmt.encode_text("good day")
    with torch.no_grad():
        blocks, _ = run.body_blocks([enc])
        top = body.hidden_states(torch.tensor([enc.input_ids]))[-1]
        want = torch.tanh(body.bert.pooler.dense(top[:, 0]))
    assert blocks.shape == (1, 1, 1, 32) and torch.allclose(blocks[0, 0, 0], want[0], atol=1e-6)
    with pytest.raises(LmforgeError, match="pooler"):
        TransferRun(tiny_gpt(bpe_tokenizer), TransferConfig(mode="frozen", pool="pooler"), ["neg", "pos"])


def test_fine_tuning_reads_what_the_hf_class_reads_and_a_fixed_mlm_only_bert_its_mean(wordpiece_tokenizer,
                                                                                      bpe_tokenizer):
    # fine-tuning trains the read-out with the body, so it defaults to the one the family's HF class reads (the
    # run then exports); a body that stays fixed reads the mean where [CLS] never learned to summarise
    nsp = tiny_bert(wordpiece_tokenizer)
    mlm = tiny_bert(wordpiece_tokenizer)
    mlm.config.next_sentence = False

    def pool(body, mode="finetune", **kw):
        return TransferRun(body, TransferConfig(mode=mode, max_len=32, **kw), ["neg", "pos"]).fmt.pool

    assert pool(nsp) == "pooler" and pool(mlm) == "pooler" and pool(mlm, task="pair") == "pooler"
    assert pool(mlm, from_scratch=True) == "pooler"  # the baseline of the same architecture reads the same way
    assert pool(tiny_gpt(bpe_tokenizer)) == "last"
    assert pool(mlm, pool="cls") == "cls"  # an explicit --pool wins
    assert pool(mlm, mode="frozen") == "mean" and pool(nsp, mode="frozen", task="pair") == "cls"
    # a pooler no loss trained starts fine-tuning at tanh([CLS]); a trained (NSP) one is kept as it is
    mlm = tiny_bert(wordpiece_tokenizer)  # a fresh one: the runs above started the other's pooler already
    mlm.config.next_sentence = False
    nsp_pooler = nsp.bert.pooler.dense.weight.detach().clone()
    assert not torch.equal(mlm.bert.pooler.dense.weight, torch.eye(32))
    pool(mlm), pool(nsp)
    assert torch.equal(mlm.bert.pooler.dense.weight, torch.eye(32)) and not mlm.bert.pooler.dense.bias.any()
    assert torch.equal(nsp.bert.pooler.dense.weight, nsp_pooler)
    x = torch.randn(2, 32)
    assert torch.allclose(mlm.bert.pooler(x[:, None, :]), torch.tanh(x))
    assert TransferConfig(mode="finetune", task="tokens").pool_choice("bert", summary_trained=False) is None


def test_defaults_depend_on_pretrained_or_scratch():
    pre = TransferConfig(mode="finetune").resolved("bert")
    scratch = TransferConfig(mode="finetune", from_scratch=True).resolved("bert")
    assert pre.lr < scratch.lr and pre.layer_lr_decay == 0.9 and scratch.layer_lr_decay is None
    wide, narrow = (TransferConfig(mode="finetune").resolved("bert", h).lr for h in (768, 128))
    assert wide == pytest.approx(5e-5) and narrow == pytest.approx(3e-4) and scratch.lr == 1e-3
    assert TransferConfig(mode="finetune", layer_lr_decay=1.0).resolved("bert").layer_lr_decay is None
    assert TransferConfig(mode="features").layer_choice("bert") == "auto"
    assert TransferConfig(mode="features", layer="mix").layer_choice("elmo") == "mix"
    assert TransferConfig(mode="frozen").layer_choice("elmo") == "mix"


def test_tagging_logreg_is_chosen_by_tag_f1_not_accuracy():
    from lmforge.transfer.features import fit_logreg

    # 90 % of the rows are O; the entity tag is weakly visible in one feature: scored by accuracy, the
    # strongest regularisation (O everywhere: 90 %) wins; scored by the F1 of the other tags it scores 0
    rng = np.random.default_rng(0)
    n = 2000
    y = (rng.random(n) < 0.1).astype(np.int64)  # 0 = O, 1 = B-PER
    X = rng.normal(size=(n, 8))
    X[:, 0] += 1.0 * y
    groups = np.arange(n) // 20  # sentences of 20 words
    by_acc = fit_logreg({0: X}, y, groups, 5, 0, grouped=True)
    by_f1 = fit_logreg({0: X}, y, groups, 5, 0, grouped=True, score_classes=[1])
    pred = lambda fit: (X - fit["mean"]) / fit["scale"] @ fit["coef"][0] + fit["intercept"][0] > 0  # noqa: E731
    assert by_f1["C"] > by_acc["C"] and by_f1["cv_accuracy"] > 0  # (the key holds the fold score chosen on)
    assert pred(by_acc).sum() == 0 and pred(by_f1)[y == 1].sum() > 0
