"""A trait type traitlets lacks: :class:`Positive`, a Float above 0 (traitlets' ``min`` is
inclusive).  Other bounds are traitlets' own (``Int(min=1)``, ``Float(min=0)``)."""

from __future__ import annotations

from traitlets import Float, TraitError

__all__ = ["Positive"]


class Positive(Float):
    """A Float that must be above 0: seconds between passes, a time-out that cannot be
    off.  Refused at assignment as traitlets refuses a value under ``min``."""

    def validate(self, obj, value):
        value = super().validate(obj, value)
        if value <= 0:
            owner = type(obj).__name__ if obj is not None else "a"
            raise TraitError(
                f"The value of the {self.name!r} trait of a {owner} instance should be "
                f"above 0, but a value of {value!r} was specified"
            )
        return value
