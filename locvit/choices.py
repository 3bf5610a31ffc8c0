"""One form for every "not one of" error: the value, the valid choices and the closest one."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any


def check_choice(field: str, value: Any, choices: Iterable[Any]) -> None:
  """Raises ``ValueError`` ``field='x' is not one of [...]; did you mean y?`` unless ``value`` is
  one of ``choices``."""
  choices = list(choices)
  if value in choices:
    return
  close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
  hint = f"; did you mean {close[0]}?" if close else ""
  raise ValueError(f"{field}={value!r} is not one of {choices}{hint}")
