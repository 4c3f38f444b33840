"""What measuring found and chose, typed: each candidate's `Measured` and the `Report` that runtime.json records per
cache key. Written by measuring.py, kept by cache.py, read by choice.py."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields


class ConversionFailed(Exception):
    """A candidate's converter failed: that candidate is refused, the others still measured."""


@dataclass
class Measured:
    """One candidate: its agreement with fp32's decisions and its speed, or why it was refused."""

    name: str  # "<runtime> <precision>", as Candidate.name
    refused: str | None = None
    agreement: float | None = None  # None: the fp32 reference, or too few held-out texts
    ties: int = 0  # held-out texts fp32 could not decide, left out of the agreement
    texts_per_s: float = 0.0
    ir: str | None = None  # its conversion's folder in the cache; None for PyTorch

    @property
    def runtime(self) -> str:
        return self.name.split()[0]

    @property
    def precision(self) -> str:
        return self.name.split()[1]


@dataclass
class Report:
    """Every candidate measured for one cache key, and the one chosen."""

    candidates: list[Measured]
    held_out_texts: int
    calibration_texts: int
    chosen: str = ""
    key: dict = field(default_factory=dict)
    texts: str | None = None  # what the agreement was measured on

    def candidate(self, name: str) -> Measured | None:
        return next((m for m in self.candidates if m.name == name), None)

    def folders(self) -> list[str]:
        """The cache folders of its conversions."""
        return sorted({m.ir for m in self.candidates if m.ir})

    def as_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Report | None:
        """A recorded report, or None when the record is not one (an older or damaged runtime.json)."""
        known = {f.name for f in fields(Measured)}
        try:
            measured = [Measured(**{k: v for k, v in m.items() if k in known}) for m in data["candidates"]]
            return cls(
                measured,
                data["held_out_texts"],
                data["calibration_texts"],
                data["chosen"],
                data["key"],
                data.get("texts"),
            )
        except (KeyError, TypeError, AttributeError):
            return None
