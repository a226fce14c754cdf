"""The ``shapes:`` section of a model: the lengths its requests take as served, with their weights.

Triton's dynamic batcher merges only requests of equal shapes, so a model with a variable axis batches
as well as its traffic's lengths allow. ``shapes:`` states that traffic for perf, tune and plan when
the model's ``sample:`` function (or the spec's ``lengths``) does not draw lengths the way real requests
come (``perf.measure.shapes``). Checks that need the model's inputs (a variable axis to apply to, its bound)
live in ``ModelSpec``.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporters.errors import SpecError
from exporters.schema.typed import at_least, check_fields


@dataclass(frozen=True)
class Shapes:
    """``shapes: {lengths: [16, 64, 200], weights: [5, 3, 2]}``: requests take ``lengths[i]`` with a
    probability proportional to ``weights[i]`` (equal weights when left out)."""

    lengths: tuple[int, ...] = at_least(1)
    weights: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        check_fields(self)
        if not self.lengths:
            raise SpecError("lengths", "must list at least one length")
        if len(set(self.lengths)) != len(self.lengths):
            raise SpecError("lengths", f"must not repeat a length, got {list(self.lengths)}")
        if self.weights and len(self.weights) != len(self.lengths):
            raise SpecError(
                "weights", f"must give one weight per length ({len(self.lengths)}), got {len(self.weights)}"
            )
        if any(not w > 0 for w in self.weights):
            raise SpecError("weights", f"must all be > 0, got {list(self.weights)}")

    @property
    def probabilities(self) -> tuple[float, ...]:
        """The weights scaled to sum to 1."""
        weights = self.weights or (1.0,) * len(self.lengths)
        total = float(sum(weights))
        return tuple(float(w) / total for w in weights)
