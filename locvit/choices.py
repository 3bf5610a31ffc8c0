"""One form for every "not one of" error (the value, the valid choices and the closest one), and
`Errors`, which gathers a config's every mistake so that they are reported at once; the command
lines' `ArgumentParser`, whose mistakes are one line too."""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Callable, Iterable
from typing import Any, NoReturn


def check_choice(field: str, value: Any, choices: Iterable[Any]) -> None:
  """Raises ``ValueError`` ``field='x' is not one of [...]; did you mean y?`` unless ``value`` is
  one of ``choices``."""
  choices = list(choices)
  if value in choices:
    return
  close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
  hint = f"; did you mean {close[0]}?" if close else ""
  raise ValueError(f"{field}={value!r} is not one of {choices}{hint}")


class Errors:
  """The messages of several checks, each line once, in order. ``check`` runs one and keeps its
  ``ValueError``; ``raise_all`` raises them as one ``ValueError``, a line each."""

  def __init__(self) -> None:
    self.messages: list[str] = []

  def add(self, message: str) -> None:
    """Keeps each line of ``message`` not already kept."""
    for line in str(message).splitlines():
      if line not in self.messages:
        self.messages.append(line)

  def check(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Calls ``fn(*args, **kwargs)``; keeps its ``ValueError``'s lines."""
    try:
      fn(*args, **kwargs)
    except ValueError as error:
      self.add(str(error))

  def raise_all(self) -> None:
    """Raises the kept lines as one ``ValueError``; nothing when there are none."""
    if self.messages:
      raise ValueError("\n".join(self.messages))


class ArgumentParser(argparse.ArgumentParser):
  """``argparse.ArgumentParser`` whose usage mistakes are one line and exit status 2,
  ``locvit.reproduce: error: argument --estimate: invalid choice: ...`` (``prog`` without its
  ``python -m``), as ``locvit.main`` prints ``locvit: error: ...``; argparse printed the usage
  block first."""

  def error(self, message: str) -> NoReturn:
    """Prints ``PROG: error: MESSAGE`` on one line and exits with status 2."""
    self.exit(2, f"{self.prog.removeprefix('python -m ')}: error: {message}\n")
