"""Build a config node's `_target_` class: only this project's classes, every error naming its key.

A node is a dict with `_target_` (a dotted class name) and the constructor's keyword
arguments. Nested nodes (the composed system's `evictor`, `prefetcher`, `admission`) are built
by their owner with the same function and a relative `where` ("evictor"); a SpecError or
KnobError raised while building a nested part comes out of the outer call prefixed once with
the outer key, so the user reads the full key: `system.evictor.slots_per_layer: ...`.
"""

from __future__ import annotations

import importlib

from core.knobs import KnobError
from core.specs import SpecError

ALLOWED_TARGET_PREFIXES = ("systems.", "workloads.", "harness.", "analysis.")


class NestedSpecError(SpecError):
    """A SpecError from building a nested node, its message relative to the owner's key
    (`evictor._target_: ...`); the outer build_target prefixes it with its own key."""


def _resolve(target, where: str, base: type | None) -> type:
    if not isinstance(target, str) or not target.startswith(ALLOWED_TARGET_PREFIXES):
        raise SpecError(f"{where}._target_: {target!r} is not a class of this project "
                        f"(allowed prefixes: {', '.join(ALLOWED_TARGET_PREFIXES)})")
    module, _, name = target.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise SpecError(f"{where}._target_: cannot import {target!r} ({exc})") from exc
    # A name re-exported by a project module (harness.runner.run.Path) is not a project class.
    if not isinstance(cls, type) or not f"{cls.__module__}.".startswith(ALLOWED_TARGET_PREFIXES):
        raise SpecError(f"{where}._target_: {target!r} is not a class of this project "
                        f"(it is {getattr(cls, '__module__', '?')}.{name})")
    if base is not None and not issubclass(cls, base):
        raise SpecError(f"{where}._target_: {target!r} is not a {base.__name__}")
    return cls


def build_target(node: dict, where: str, base: type | None = None):
    """Instantiate `_target_` with the node's other keys; only this project's classes.

    `where` is the node's key as the user writes it ("system", "workload"). Errors are
    SpecError naming the key: a bad target, a bad knob (KnobError: `system.<knob>: ...`), a
    bad nested node (`system.evictor.<...>: ...`, prefixed once)."""
    if not isinstance(node, dict):
        raise SpecError(f"{where}: must be a config node with a _target_, got {node!r}")
    node = dict(node)
    cls = _resolve(node.pop("_target_", None), where, base)
    try:
        return cls(**node)
    except NestedSpecError as exc:  # relative to this node: `evictor.slots_per_layer: ...`
        raise SpecError(f"{where}.{exc}") from exc.__cause__
    except SpecError:
        raise  # already names its full key
    except KnobError as exc:  # the message starts with the knob: `system.slots_per_layer: ...`
        raise SpecError(f"{where}.{exc}") from exc
    except (TypeError, ValueError) as exc:
        raise SpecError(f"{where}: {exc}") from exc


def build_part(node, where: str, base: type):
    """A nested part for an owner's constructor: an instance of `base` is taken as it is, a
    node is built; errors are NestedSpecError relative to the owner (`where` = "evictor")."""
    if isinstance(node, base):
        return node
    try:
        return build_target(node, where, base)
    except SpecError as exc:
        raise NestedSpecError(str(exc)) from (exc.__cause__ or exc)
