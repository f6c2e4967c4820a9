"""``--search-shape``: the budget planner chooses the model shape too, among the family's presets of its default's
kind, smallest first.

Each shape gets ``D`` training tokens for ``N`` body parameters (all but the token / position embeddings and an
untied output layer: Kaplan et al. 2020).  Chinchilla (Hoffmann et al. 2022) found the loss at a fixed compute
lowest near ``D ~= 20 N``; the search scores ``|ln((D_eff/N) / 20)|``, the under-trained side at half weight
(cramming, Geiping & Goldstein 2022: at tiny budgets the largest model that still gets enough steps learns most),
where ``D_eff`` counts at most four passes over the text (Muennighoff et al. 2023).  The lowest score wins (a tie:
the larger shape).  A time budget probes the shapes smallest first and stops at the first one that is already
under-trained or too slow.  When the winner would make all its passes in at most half of a time budget, BERT and
ELECTRA take the smallest larger shape that uses the whole budget.
"""

from __future__ import annotations

import math
from typing import Any

from ..families import get_family
from .budget_probe import (
    PROBE_FRACTION,
    PROBE_MAX_SECONDS,
    PROBE_STEP_SECONDS,
    PROBE_STEPS,
    Candidate,
    Probe,
    step_tokens,
    steps_for,
    train_seconds,
)
from .config import TrainConfig
from .precision import PrecisionChoice

TOKENS_PER_PARAM = 20.0  # Chinchilla's compute-optimal D/N
UNDERTRAIN_WEIGHT = 0.5  # weight of ln(20 / (D/N)) for a shape that sees fewer than 20 tokens per parameter
FULL_VALUE_EPOCHS = 4.0  # repeated data counts fully up to this many passes
# a family whose Family.grows_when_capped says so moves to a larger shape when a time budget outlasts the small one's
# passes (measured for BERT on one small corpus only: the tweets, docs/training.md "Budgets") ...
GROW_MAX_SHARE = 0.5  # ... and only when the small shape's passes would take at most this share of the time


def score(tokens_per_param: float) -> float:
    """Distance from Chinchilla's 20 tokens/param in log space; the under-trained side counts less."""
    r = max(tokens_per_param, 1e-12) / TOKENS_PER_PARAM
    return math.log(r) if r >= 1 else UNDERTRAIN_WEIGHT * -math.log(r)


def record(c: Candidate) -> dict[str, Any]:
    """The plan's record of one candidate, before it is probed or scored."""
    return {"name": c.name, "params": c.params, "body_params": c.body_params, "tokens_per_s": None,
            "steps": None, "tokens_per_param": None, "score": None, "note": ""}


def note_precision(rec: dict, choice: PrecisionChoice | None) -> None:
    """Record in a candidate's ``rec`` the precision its probe trained in (a probe that does not say: nothing);
    ``precision_choice`` (with the reason) stays out of the saved plan."""
    if choice is not None:
        rec["precision"], rec["precision_choice"] = choice.precision, choice


def fill(rec: dict, c: Candidate, timed: bool, train: TrainConfig, unique: int, trainer_family: bool,
         tokens: float, most_epochs: float) -> None:
    """Steps (epochs for word2vec), tokens/param and score of a candidate given ``tokens`` of budget."""
    steps, uncapped = steps_for(c, tokens, timed, train, unique, trainer_family, most_epochs)
    d = step_tokens(c, steps, unique, trainer_family)
    rec.update(capped=uncapped > steps, uncapped_steps=uncapped, steps=steps,
               tokens_per_param=round(d / max(c.body_params, 1), 3))
    d_eff = min(d, FULL_VALUE_EPOCHS * unique)
    rec["score"] = round(score(d_eff / max(c.body_params, 1)), 4) if steps else None


def _skip(c: Candidate, records: list[dict], budget_s: float, cap: float, spent: float, trainer_family: bool,
          min_steps: int) -> str:
    """Why a larger shape is not probed ('' to probe it): its throughput is guessed from the last probed one."""
    last = next(r for r in reversed(records[:-1]) if r["tokens_per_s"])
    est_tps = last["tokens_per_s"] * last["params"] / max(c.params, 1)
    if last["tokens_per_param"] is not None and last["tokens_per_param"] < TOKENS_PER_PARAM:
        return "not probed: a smaller shape is already under-trained"
    if trainer_family and est_tps * train_seconds(budget_s, cap) / max(c.tokens_per_step, 1.0) < min_steps:
        return f"not probed: too slow for {min_steps} steps"
    est_step = c.tokens_per_step / max(est_tps, 1e-9) if trainer_family else 0.0
    if spent + est_step * (1 + PROBE_STEPS[0]) + PROBE_STEP_SECONDS > cap:
        return "not probed: the probe's time is spent"
    return ""


def probe_ladder(family: str, cands: list[Candidate], budget_s: float, train: TrainConfig, unique: int, shards,
                 probe: Probe, trainer_family: bool, most_epochs: float, min_steps: int) -> list[dict]:
    """Probe the shapes smallest first within the probe's share of a time budget; one record per shape."""
    cap = min(PROBE_MAX_SECONDS, PROBE_FRACTION * budget_s)
    records: list[dict] = []
    spent = 0.0
    for i, c in enumerate(cands):
        rec = record(c)
        records.append(rec)
        if i > 0 and (why := _skip(c, records, budget_s, cap, spent, trainer_family, min_steps)):
            rec["note"] = why
            continue
        res = probe(family, c, train, shards, max(cap - spent, 1.0))
        spent += res.seconds
        rec["tokens_per_s"], rec["probe_seconds"] = float(res.tokens_per_s), float(res.seconds)
        note_precision(rec, res.precision)
        fill(rec, c, True, train, unique, trainer_family, rec["tokens_per_s"] * train_seconds(budget_s, cap),
             most_epochs)
    for c, rec in zip(cands, records):  # final figures with the time the probe really took
        if rec["tokens_per_s"]:
            fill(rec, c, True, train, unique, trainer_family, rec["tokens_per_s"] * train_seconds(budget_s, spent),
                 most_epochs)
    return records


def choose(family: str, feasible: list[tuple[Candidate, dict]], timed: bool, unique: int, most_epochs: float,
           warnings: list[str]) -> tuple[Candidate, dict]:
    """The lowest score (a tie: the larger shape), grown when a time budget outlasts its passes."""
    cand, rec = min(feasible, key=lambda cr: (cr[1]["score"], -cr[0].params))
    if timed and rec.get("capped") and get_family(family).grows_when_capped:
        cand, rec = _grow_when_capped(cand, rec, feasible, unique, most_epochs, warnings)
    return cand, rec


def _grow_when_capped(cand: Candidate, rec: dict, feasible: list, unique: int, most_epochs: float,
                      warnings: list[str]) -> tuple[Candidate, dict]:
    """The smallest larger shape that spends the whole time budget within the pass cap, if any."""
    larger = [(c, r) for c, r in feasible if c.params > cand.params and not r.get("capped")
              and r["steps"] * c.tokens_per_step >= FULL_VALUE_EPOCHS * unique]
    share = rec["steps"] / max(rec["uncapped_steps"], 1)
    if not larger or share > GROW_MAX_SHARE:
        return cand, rec
    grown, grown_rec = min(larger, key=lambda cr: cr[0].params)
    passes = grown_rec["steps"] * grown.tokens_per_step / unique
    rec["note"] = f"makes its {most_epochs:g} passes in {share:.0%} of the training time"
    warnings.append(f"'{cand.name}' would make all {most_epochs:g} passes over the {unique:,} training tokens in "
                    f"{share:.0%} of the training time; the plan takes '{grown.name}', which trains for all of it "
                    f"({passes:.1f} passes)")
    return grown, grown_rec
