"""What earlier runs on the same hardware teach a new one (what ``autotune serve`` passes).

A team tunes many models on a few kinds of hardware: what one run fitted (the cost model's
constants: how fast this hardware, this software, this network really are) holds for the
next model too, and the configurations that won before are good first guesses for a model
of a similar shape. ``model_based`` takes both: the fitted constants as its prior in place of
the datasheet's (with the doubt the earlier fit left), and the earlier answers, nearest
first, measured before its own choices where its space holds them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from autotune.tuner.cost_model import CostModel, Prior


@dataclass(frozen=True)
class WarmStart:
    """What earlier runs on the same hardware taught.

    Attributes:
        cost_model: a cost model fitted there (:meth:`CostModel.to_dict`, as ``summary.json``
            keeps it), whose constants start the fit instead of the datasheet's.
        answers: earlier runs' best configurations as dotted-key overrides (the stage, the
            micro-batch, the knobs), nearest job first: measured first where the space has
            them.
    """

    cost_model: Mapping[str, Any] | None = None
    answers: tuple[Mapping[str, Any], ...] = field(default_factory=tuple)

    def prior(self) -> Prior | None:
        """The fitted constants as a prior: their values as the means, their posterior
        doubt as the widths, the fit's misfit for a variant it did not measure as the
        prediction's. None without a cost model, or one fitted with other constants."""
        if self.cost_model is None:
            return None
        try:
            model = CostModel.from_dict(self.cost_model)
        except (ValueError, KeyError, TypeError):
            return None  # fitted by an earlier version of the model: the datasheet stands
        sd = tuple(max(1e-6, row[i]) ** 0.5 for i, row in enumerate(model.covariance))
        return Prior(
            mean=model.u,
            sd=sd,
            hardware=model.prior.hardware,
            misfit=model.misfit_unmeasured,
            calibrated=True,
        )
