"""The model card's "Pretraining diagnostics" section: the last validation's collapse measure and RTD AUC, with
how to read them (the measures are defined in :mod:`lmforge.nn.diagnostics`)."""

from __future__ import annotations

import math
from typing import Any

# metric -> how a reader takes its value
READINGS = {
    "token_cos": (
        "mean cosine between the top-layer vectors of two tokens of the same text. Near 1.0 the vectors have "
        "collapsed onto one direction and no longer tell the tokens apart; an encoder that learns stays well "
        "below (a shared direction keeps it above 0). A value that climbs towards 1 during pretraining is "
        "the warning sign."
    ),
    "rtd_auc": (
        "the chance that the discriminator scores a replaced token above an original one (`[CLS]`, `[SEP]` and "
        "padding left out). 0.5 is a coin toss: the detector has learned nothing that tells them apart; 1.0 "
        "separates them perfectly."
    ),
}


def diagnostics_section(final: dict[str, Any]) -> str:
    """The section for the final validation metrics ``final``; "" when they hold no diagnostic."""
    rows = []
    for key, reading in READINGS.items():
        value = final.get(key)
        if isinstance(value, (int, float)):
            shown = f"{value:.3f}" if math.isfinite(value) else str(value)
            rows.append(f"| `{key}` | {shown} | {reading} |")
    if not rows:
        return ""
    return (
        "## Pretraining diagnostics\n\n"
        "At the last validation of pretraining (every validation logs them in `metrics.jsonl`):\n\n"
        "| diagnostic | value | how to read it |\n|---|---|---|\n" + "\n".join(rows) + "\n"
    )


__all__ = ["READINGS", "diagnostics_section"]
