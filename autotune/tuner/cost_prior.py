"""Where the cost model's constants start (:class:`Prior`): the datasheet's figures times
what published runs achieved of them (:func:`prior_for`), each with how far one run's
software may sit from them, and the model's own misfit before anything ran."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from autotune.tuner.calibration import calibrated_ratios, datasheet_basis, uncalibrated_guess
from autotune.tuner.cost_terms import CONSTANTS, Constant
from autotune.tuner.hardware import CPU_RANK, Hardware
from autotune.tuner.step_counts import Topology

# The model's own misfit, relative, before the fit's residuals say otherwise: for a ZeRO
# variant something of has run (near what was measured), and for one nothing of has.
PRIOR_MISFIT_MEASURED = 0.02
PRIOR_MISFIT_UNMEASURED = 0.05
PRIOR_MISFIT_WEIGHT = 2.0


@dataclass(frozen=True)
class Prior:
    """Where the constants start: each one's transformed value and the standard deviation of
    that guess (in natural-log units for the rates: ``log(3)`` is "within a factor of 3"),
    what a fit starts from.

    ``misfit`` is how far a prediction from these constants alone lands from a measurement
    (relative): the calibration's residual on the published tables where the means are
    calibrated (``calibrated``), the default guess elsewhere. A prediction before anything
    ran carries that, not the width of the fit's starting guess.
    """

    mean: tuple[float, ...]
    sd: tuple[float, ...]
    hardware: str = ""
    misfit: float = PRIOR_MISFIT_UNMEASURED
    calibrated: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "mean": list(self.mean),
            "sd": list(self.sd),
            "hardware": self.hardware,
            "misfit": self.misfit,
            "calibrated": self.calibrated,
        }


def _transform(constant: Constant, value: float) -> float:
    return math.log(value / (1 - value)) if constant.transform == "logit" else math.log(value)


def prior_for(hardware: Hardware, topology: Topology) -> Prior:
    """The datasheet's figures times what published runs achieved of them: the calibration
    (:func:`autotune.tuner.calibration.calibrated_ratios`) for a GPU, broad guesses for CPU
    ranks (or where no calibration is installed). The widths stay broad either way: they
    are how far one run's software may sit from the published ones, which its fit finds out.

    Example:
        >>> from autotune.tuner.hardware import CATALOG
        >>> prior = prior_for(CATALOG["v100-32gb"], Topology(16, 16, "fp16"))
        >>> prior.calibrated, 0.1 < math.exp(prior.mean[0]) / 125e12 < 0.6  # of the peak
        (True, True)
    """
    cpu = hardware.name == CPU_RANK.name
    guesses = uncalibrated_guess(cpu)
    calibrated = None if cpu else calibrated_ratios(hardware.name, topology.precision)
    basis = datasheet_basis(hardware, topology.precision)
    mean, sd = [], []
    for constant in CONSTANTS:
        ratio, spread = guesses[constant.name]
        if calibrated is not None:
            ratio = calibrated.ratios[constant.name]
        value = basis[constant.name] * ratio
        mean.append(_transform(constant, value))
        sd.append(spread)
    if calibrated is None:
        return Prior(tuple(mean), tuple(sd), hardware.name)
    return Prior(tuple(mean), tuple(sd), hardware.name, calibrated.misfit, calibrated=True)
