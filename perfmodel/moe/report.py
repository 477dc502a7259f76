"""``perfmodel profile crossover``'s answer: an expert's n*, derived and fitted."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hardware.maxaffine import Provenance
from perfmodel.moe.expert import Crossover, crossover_tokens


@dataclass(frozen=True)
class CrossoverReport:
    """n* of one expert shape on one device: the roofline's, and the fit's with data."""

    hardware: str
    model: str
    hidden: int
    inter: int
    mats: int
    derived_n_star: float
    #: with measurements: the fitted block, its provenance and the row padding used
    fitted: Crossover | None = None
    provenance: Provenance | None = None
    padded: bool = True
    out: Path | None = None  # where the fitted profile was written

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "hardware": self.hardware,
            "model": self.model,
            "expert_shape": {"hidden": self.hidden, "inter": self.inter, "mats": self.mats},
            "derived_n_star": self.derived_n_star,
        }
        if self.out is not None:
            d["out"] = str(self.out)
        c, prov = self.fitted, self.provenance
        if c is not None:
            d.update(
                fitted_n_star=c.n_star,
                interval_95=[c.lo, c.hi],
                boots=c.boots,
                padded=self.padded,
                fitted_n_star_one_expert=crossover_tokens(c.profile, G=1.0),
                train_mdape_pct=None if prov is None else prov.train_mape,
                heldout_mdape_pct=None if prov is None else prov.heldout_mape,
                profile=c.profile.to_dict(),
            )
        return d
