"""Hydra structured configs made from the simulator's frozen dataclasses (:func:`mirror`).

OmegaConf reads a dataclass as a schema, but the simulator's specs do not fit it
as they are: they are frozen (OmegaConf makes their nodes read-only), some fields
are ``Literal`` or unions it does not know, and their checks would name a spec's
field rather than a config key. :func:`mirror` makes a mutable twin with types
OmegaConf checks; instantiating the twin checks ``Literal`` values and builds the
real dataclass, so that its own checks run, and any error is a
:class:`ConfigError` that names the config key.
"""

import dataclasses
import functools
import types
from collections.abc import Callable, Mapping
from dataclasses import field
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from omegaconf import MISSING, DictConfig, OmegaConf


class ConfigError(ValueError):
    """A config value is invalid; the message names the key, the value and what is valid."""


def one_of(key: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}={value}: must be one of {', '.join(map(str, allowed))}")


def _config_type(hint: Any) -> tuple[Any, tuple | None]:
    """The type OmegaConf checks for a field annotated ``hint`` and, for a ``Literal``, its allowed values."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is Literal:
        return type(args[0]), args
    if origin in (Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            inner, allowed = _config_type(rest[0])
            return inner | None, allowed
        return Any, None
    if origin in (dict, Mapping):
        return dict[str, _config_type(args[1])[0]], None  # type: ignore[misc]
    if dataclasses.is_dataclass(hint):
        return mirror(hint, ""), None  # type: ignore[arg-type]
    return (hint, None) if hint in (int, float, str, bool) else (Any, None)


def _as_config(value: Any) -> Any:
    """A default value as its schema holds it: dataclass values become their mirrors."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return mirror(type(value), "")(**{f.name: _as_config(getattr(value, f.name))
                                           for f in dataclasses.fields(value) if f.init})
    if isinstance(value, Mapping):
        return {k: _as_config(v) for k, v in value.items()}
    return value


def _as_spec(value: Any) -> Any:
    """A validated config value as the simulator takes it: mirrors become the dataclasses they mirror."""
    if hasattr(value, "to_spec"):
        return value.to_spec()
    if isinstance(value, Mapping):
        return {k: _as_spec(v) for k, v in value.items()}
    return value


def _null_mapping(f: dataclasses.Field, hint: Any) -> bool:
    """An optional mapping that defaults to None (ReplayOptions.domain_map)."""
    rest = [a for a in get_args(hint) if a is not type(None)]
    return f.default is None and len(rest) == 1 and get_origin(rest[0]) in (dict, Mapping)


def _default(f: dataclasses.Field, hint: Any) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        if isinstance(value, Mapping) and not all(dataclasses.is_dataclass(v) for v in value.values()):
            # A yaml's mapping merges into the schema's (keys add up), so a plain mapping such as
            # domain_mix has no schema default: each option's yaml states it whole.
            return field(default=MISSING)
        return field(default_factory=functools.partial(lambda make: _as_config(make()), f.default_factory))
    if f.default is dataclasses.MISSING:
        return field(default=MISSING)
    if _null_mapping(f, hint):
        # An override cannot merge into a null mapping (traffic.domain_map={a: b} would fail), so the schema
        # starts it empty, and an empty mapping stands for None again (spec_fields).
        return field(default_factory=dict)
    if dataclasses.is_dataclass(f.default) or isinstance(f.default, Mapping):
        return field(default_factory=functools.partial(_as_config, f.default))
    return field(default=f.default)


@functools.cache
def mirror(cls: type, where: str, skip: tuple[str, ...] = (), extra: tuple[tuple[str, Any, Any], ...] = (),
           build: Callable[[Any], Any] | None = None, check: Callable[[Any], None] | None = None) -> type:
    """A mutable dataclass with the init fields of ``cls`` (less ``skip``) in types OmegaConf knows, after the
    ``extra`` fields ``(name, type, default)``.

    Instantiating it (``OmegaConf.to_object``) checks ``Literal`` fields against their values, runs ``check``
    and builds the real value (``cls(**self.spec_fields())``, or ``build(self)``) so that ``cls``'s own checks
    run; any error is a :class:`ConfigError` that starts with ``where``. ``to_spec()`` returns the real value.
    """
    hints = get_type_hints(cls)
    own = [f for f in dataclasses.fields(cls) if f.init and f.name not in skip]
    allowed = {f.name: _config_type(hints[f.name])[1] for f in own}
    null_mappings = {f.name for f in own if _null_mapping(f, hints[f.name])}
    fields_ = [(name, tp, field(default=default)) for name, tp, default in extra]
    fields_ += [(f.name, _config_type(hints[f.name])[0], _default(f, hints[f.name])) for f in own]

    def spec_fields(self: Any) -> dict[str, Any]:
        """The mirrored fields as ``cls`` takes them."""
        values = {f.name: _as_spec(getattr(self, f.name)) for f in own}
        return {k: None if k in null_mappings and not v else v for k, v in values.items()}

    def to_spec(self: Any) -> Any:
        return cls(**spec_fields(self)) if build is None else build(self)

    def __post_init__(self: Any) -> None:
        for name, values in allowed.items():
            value = getattr(self, name)
            if values is not None and value is not None:
                one_of(f"{where}.{name}", value, values)
        if check is not None:
            check(self)
        try:
            to_spec(self)
        except ConfigError:
            raise
        except (ValueError, TypeError) as err:
            message = str(err)
            raise ConfigError(message if message.startswith(where) else f"{where}: {message}") from err

    namespace = {"spec_fields": spec_fields, "to_spec": to_spec, "__post_init__": __post_init__,
                 "__module__": __name__}
    return dataclasses.make_dataclass(f"{cls.__name__}Config", fields_, namespace=namespace)


def plain_fields(cls: type, skip: tuple[str, ...]) -> tuple[tuple[str, Any, Any], ...]:
    """``(name, type, default)`` of the plain init fields of ``cls``, for :func:`mirror`'s ``extra``."""
    hints = get_type_hints(cls)
    return tuple((f.name, _config_type(hints[f.name])[0], f.default) for f in dataclasses.fields(cls)
                 if f.init and f.name not in skip)


def open_mappings(schema: type) -> DictConfig:
    """``schema`` as a config whose mappings of plain values (``domain_mix``, ``domain_map``) take new keys
    without a ``+`` (``traffic.domain_map.support=chat``); Hydra makes every other node strict."""
    node = OmegaConf.structured(schema)
    for f in dataclasses.fields(schema):
        hint = f.type
        args = [a for a in get_args(hint) if a is not type(None)] if get_origin(hint) is types.UnionType else [hint]
        if len(args) == 1 and get_origin(args[0]) is dict and not dataclasses.is_dataclass(get_args(args[0])[1]):
            OmegaConf.set_struct(node._get_node(f.name), False)  # type: ignore[arg-type]
    return node
