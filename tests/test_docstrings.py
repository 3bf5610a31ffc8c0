"""Every public module, function, class and method of `locvit` has a docstring (issue 8).

Runtime: about 2 s on 2 CPU cores, nearly all of it importing every module once.
"""

import dataclasses
import functools
import importlib
import inspect
import pkgutil
import re
import types

import flax.linen as nn

import locvit
import locvit.attention

# Flax calls `setup` itself; it is an implementation hook, not API.
_EXEMPT_METHODS = frozenset({"setup"})


def _has_doc(obj: object) -> bool:
  return obj is not None and bool((obj.__doc__ or "").strip())


def _has_class_doc(cls: type) -> bool:
  """The class's own docstring, not one `dataclasses` generated from its signature."""
  if not _has_doc(cls):
    return False
  if not dataclasses.is_dataclass(cls):
    return True
  return cls.__doc__ != cls.__name__ + str(inspect.signature(cls)).replace(" -> None", "")


def _modules() -> list[types.ModuleType]:
  modules = [locvit]
  for info in pkgutil.walk_packages(locvit.__path__, "locvit."):
    if info.name.split(".")[-1] == "__main__":
      continue  # importing a CLI entry point runs it
    if info.name.startswith("locvit.configs."):
      continue  # the shipped experiment configs (get_config files), not library API
    modules.append(importlib.import_module(info.name))
  return modules


def _is_function(obj: object) -> bool:
  """A plain function, or one wrapped by a decorator (``functools.cache``, ``jax.custom_vjp``)."""
  return inspect.isfunction(obj) or (
    callable(obj) and hasattr(obj, "__wrapped__") and inspect.isfunction(inspect.unwrap(obj))
  )


def _method_targets(member: object) -> list[object]:
  """The callables behind one class attribute that need a docstring (empty if none)."""
  if isinstance(member, staticmethod | classmethod):
    return [member.__func__]
  if isinstance(member, property):
    return [member.fget]
  if isinstance(member, functools.cached_property):
    return [member.func]
  if _is_function(member):
    return [member]
  return []


def _missing_in_class(cls: type, qualname: str) -> list[str]:
  """Public methods and properties defined on `cls` itself that lack a docstring."""
  # A dataclass field whose default is a function (Flax `kernel_init = zeros`) is data.
  fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
  missing = []
  for name, member in vars(cls).items():
    if name.startswith("_") or name in fields or name in _EXEMPT_METHODS:
      continue
    if any(not _has_doc(target) for target in _method_targets(member)):
      missing.append(f"{qualname}.{name}")
  return missing


def _missing_docstrings() -> list[str]:
  missing = []
  for module in _modules():
    if not _has_doc(module):
      missing.append(module.__name__)
    for name, obj in vars(module).items():
      if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
        continue  # private, or imported from elsewhere (checked where it is defined)
      if not (_is_function(obj) or inspect.isclass(obj)):
        continue
      qualname = f"{module.__name__}.{name}"
      if inspect.isclass(obj):
        if not _has_class_doc(obj):
          missing.append(qualname)
        missing += _missing_in_class(obj, qualname)
      elif not _has_doc(obj):
        missing.append(qualname)
  return missing


def test_walk_sees_the_whole_package():
  names = {module.__name__ for module in _modules()}
  assert {"locvit.train", "locvit.attention.gpsa", "locvit.models.vit"} <= names
  assert "locvit.convert.__main__" not in names


def test_every_public_name_has_a_docstring():
  missing = _missing_docstrings()
  assert not missing, f"{len(missing)} public names lack a docstring:\n" + "\n".join(missing)


def test_checker_flags_missing_and_skips_dataclass_callables():
  @dataclasses.dataclass
  class Undocumented:
    size: int = 1

  assert Undocumented.__doc__  # dataclasses writes one from the signature ...
  assert not _has_class_doc(Undocumented)  # ... which does not count

  @dataclasses.dataclass
  class Example:
    """Documented."""

    init: object = lambda: 0  # a callable field, not a method

    def documented(self):
      """Yes."""

    def undocumented(self):
      pass

    @property
    def bare_property(self):
      return 0

    @staticmethod
    def bare_static():
      pass

  assert _has_class_doc(Example)
  assert _missing_in_class(Example, "Example") == [
    "Example.undocumented",
    "Example.bare_property",
    "Example.bare_static",
  ]
  assert _is_function(functools.cache(Example.documented))


def test_checker_on_flax_modules():
  class Layer(nn.Module):
    kernel_init: object = nn.initializers.zeros  # a function-valued field, as in locvit layers

    def setup(self):
      pass

    def helper(self):
      pass

  assert not _has_class_doc(Layer)  # Flax's dataclass transform writes a signature docstring
  assert _missing_in_class(Layer, "Layer") == ["Layer.helper"]


def _undocumented_fields(cls: type) -> list[str]:
  """Fields of a Linen module that neither its docstring nor a Linen base's names."""
  docs = " ".join(c.__doc__ or "" for c in cls.__mro__ if issubclass(c, nn.Module))
  fields = [f.name for f in dataclasses.fields(cls) if f.name not in ("parent", "name", "_")]
  return [field for field in fields if not re.search(rf"\b{field}\b", docs)]


def test_the_layers_for_ones_own_model_document_every_field():
  """The Linen modules a user imports (locvit.attention, locvit.models.layers): every field is
  named in the class's docstring or a base's."""
  from locvit.attention import GMMAttention
  from locvit.models import layers

  classes = [getattr(locvit.attention, name) for name in locvit.attention.__all__]
  classes += [obj for name, obj in vars(layers).items() if not name.startswith("_")]
  modules = [c for c in classes if inspect.isclass(c) and issubclass(c, nn.Module)]
  modules = [c for c in modules if c.__module__.startswith("locvit.")]
  assert GMMAttention in modules and layers.Block in modules
  missing = {c.__name__: _undocumented_fields(c) for c in modules}
  assert not {name: fields for name, fields in missing.items() if fields}
