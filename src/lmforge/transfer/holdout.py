"""A test split held out of the training file, for ``lmforge finetune`` without ``--test``.

The draw is scikit-learn's ``train_test_split``: seeded, and stratified by label for sentence tasks
(classify, pair, choice) so every class keeps its share in both parts; a class with a single example
cannot be split in proportion, and then the draw is plain random.  Tagging and QA examples are drawn at
random.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from ..data.tasks import TaskData
from ..errors import DataError
from ..utils import seed32
from .specs import SPECS


@dataclasses.dataclass(frozen=True)
class Holdout:
    """The two parts and how they were drawn (for the run's summary)."""

    train: TaskData
    test: TaskData
    fraction: float
    seed: int
    stratified: bool

    def describe(self) -> str:
        """``"the test set is 20% of train.csv held out (40 of 200 examples, seed 0, stratified by label)"``."""
        how = ", stratified by label" if self.stratified else ""
        n = len(self.train) + len(self.test)
        return (f"the test set is {self.fraction:.0%} of {self.train.source} held out "
                f"({len(self.test)} of {n} examples, seed {self.seed}{how}); give --test FILE to score on your own")


def _label(ex) -> object:
    return getattr(ex, "label", None)


def hold_out(data: TaskData, fraction: float, seed: int) -> Holdout:
    """Split ``data`` into (train, test) with ``fraction`` of it in test.

    Raises:
        DataError: a fraction outside (0, 1), or too few examples to leave some on each side.
    """
    from sklearn.model_selection import train_test_split

    if not 0 < fraction < 1:
        raise DataError(f"--test-fraction must be between 0 and 1 (e.g. 0.2), got {fraction}")
    n = len(data)
    n_test = round(fraction * n)
    if n_test < 1 or n - n_test < 2:
        raise DataError(f"{data.source} has {n} examples: too few to hold out a test set of {fraction:.0%}; "
                        f"give --test FILE")
    labels = [_label(ex) for ex in data.examples]
    counts = Counter(labels)
    stratify = None
    if SPECS[data.task].stratify and None not in counts and min(counts.values()) >= 2 \
            and n_test >= len(counts) and n - n_test >= len(counts):
        stratify = [str(lab) for lab in labels]
    train_idx, test_idx = train_test_split(list(range(n)), test_size=n_test, random_state=seed32(seed), shuffle=True,
                                           stratify=stratify)
    train = TaskData(data.task, [data.examples[i] for i in sorted(train_idx)], list(data.labels), data.source)
    test = TaskData(data.task, [data.examples[i] for i in sorted(test_idx)], list(data.labels),
                    f"{data.source} (held out)")
    return Holdout(train, test, fraction, seed, stratify is not None)
