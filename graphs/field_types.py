"""Type checks of torch-style option dataclasses (optimizers, losses) by their fields' annotations.

torch's own value checks (``lr >= 0``, ``tuple(betas)``, ``0 <= label_smoothing <= 1``) assume
the type: given ``betas=3`` or ``lr="abc"`` they fail with ``'int' object is not iterable`` or
``'>=' not supported between instances of 'str' and 'float'``, naming neither the option nor what
to pass. ``check_field_types`` runs first and says both.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _is_pair(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2 and all(map(_is_real, value))


EXPECTED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "float": (_is_real, "a number"),
    "int": (_is_int, "an int"),
    "bool": (lambda value: isinstance(value, (bool, np.bool_)), "True or False"),
    "str": (lambda value: isinstance(value, str), "a string"),
    "tuple[float, float]": (_is_pair, "two numbers"),
}
"""A field's annotation (as written, ``from __future__ import annotations``) -> (accepts, in words);
fields of other annotations are not checked here."""


def check_field_types(options: Any, owner: str) -> None:
    """Refuses a field of another type than its annotation's, naming ``owner``, the field, the value and the default.

    Raises:
        TypeError: A value of another type (``Adam: betas must be two numbers, e.g. betas=(0.9, 0.999)
            (torch's default), got int 3``).
    """
    for field in dataclasses.fields(options):
        expected = EXPECTED.get(str(field.type))
        value = getattr(options, field.name)
        if expected is not None and not expected[0](value):
            default = "" if field.default is dataclasses.MISSING else f", e.g. {field.name}={field.default!r}"
            raise TypeError(
                f"{owner}: {field.name} must be {expected[1]}{default} (torch's default), "
                f"got {type(value).__name__} {value!r}"
            )
