"""One description per setting. A config dataclass's field carries its label, its help, the bounds a form offers and
its choices in `dataclasses.field(metadata=…)`, written with `config_field(…)`; the command line and the Streamlit forms
(pages/_ui/forms.py) read them there, and both follow the field's type: bool, int, float, str (or None), a Literal's
choices, or a tuple of one of these.

    dropout: float = config_field(0.1, label="Dropout", help="…", min=0.0, max=0.9)

    add_config_args(parser, Cls, Cls())            --dropout, a float flag defaulting to 0.1 (a nested config's
                                                    fields as --lora-r …); DECLARED instead of Cls(): the declared
                                                    defaults (a config with required fields has no Cls())
    Cls(**config_args(parser.parse_args(argv), Cls))   the values back ({"lora_r": …} for a nested config's fields)
    config_argv(cfg)                               the flags that give cfg back (what a background job is started with)
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import typing
from typing import Any, Collection, Literal, Mapping

SCALARS = (bool, int, float, str)  # the types a flag parses (or each of its values, for a tuple)
DECLARED = object()  # add_config_args's defaults: each field's declared default


def config_field(
    default: Any = dataclasses.MISSING,
    *,
    label: str,
    help: str,
    min: float | None = None,
    max: float | None = None,
    step: float | None = None,
    choices: Collection[str] = (),
    flag: str | None = None,
    default_factory: Any = dataclasses.MISSING,
) -> Any:
    """A dataclass field described once. `min`, `max`, `step`: what a form's number input offers (what is valid is the
    config's __post_init__'s to say); `choices`: the values a str field (or each item of a tuple of str) takes, where
    the type is not a Literal (a registry — a Mapping — is kept, not copied: its keys when a parser or form is built,
    so an entry added later is a choice too); `flag`: the command-line flag where the commands spell it otherwise than
    --field-name."""
    metadata = {"label": label, "help": help, "min": min, "max": max, "step": step, "choices": _choices(choices)}
    return dataclasses.field(default=default, default_factory=default_factory, metadata={**metadata, "flag": flag})


@dataclasses.dataclass(frozen=True)
class FieldInfo:
    """A config field as the command line and the forms see it."""

    path: tuple[str, ...]  # ("lora", "r"): the field inside its config
    flag: str  # --lora-r
    type: Any  # the resolved type hint
    default: Any  # the declared default
    label: str
    help: str
    min: float | None
    max: float | None
    step: float | None
    choices: Collection  # the values it (or each of its items) takes, or a registry's keys; () when any value goes

    @property
    def key(self) -> str:
        """The name config_args returns it under: the field's, prefixed by its config's field when nested (lora_r)."""
        return "_".join(self.path)

    @property
    def dest(self) -> str:
        """Its attribute on the parsed arguments (argparse's, from the flag)."""
        return self.flag[2:].replace("-", "_")

    @property
    def is_tuple(self) -> bool:
        return typing.get_origin(self.type) is tuple

    @property
    def item(self) -> Any:
        """The type of the value (a tuple's: of each item), None of an optional one left out; a Literal as its type."""
        typ = typing.get_args(self.type)[0] if self.is_tuple else self.type
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        if typing.get_origin(typ) is Literal:
            return type(args[0])
        return args[0] if len(args) == 1 else typ  # str | None → str


@functools.cache
def field_infos(cls: type) -> dict[str, FieldInfo]:
    """Every field of config dataclass `cls` by name, as a FieldInfo (a field without a description gets a label from
    its name and no help: tests/test_config_fields.py holds every exposed config to one)."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        typ, meta = hints[f.name], f.metadata
        item = typing.get_args(typ)[0] if typing.get_origin(typ) is tuple else typ
        choices = typing.get_args(item) if typing.get_origin(item) is Literal else meta.get("choices", ())
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default  # or MISSING
        out[f.name] = FieldInfo(
            path=(f.name,),
            flag=meta.get("flag") or f"--{f.name.replace('_', '-')}",
            type=typ,
            default=default,
            label=meta.get("label", f.name.replace("_", " ").capitalize()),
            help=meta.get("help", ""),
            min=meta.get("min"),
            max=meta.get("max"),
            step=meta.get("step"),
            choices=_choices(choices),
        )
    return out


def _choices(choices: Collection) -> Collection:
    return choices if isinstance(choices, Mapping) else tuple(choices)


def flat_fields(cls: type, *, only: Collection[str] | None = None, skip: Collection[str] = ()) -> list[FieldInfo]:
    """The fields of `cls` in order, a nested config's (TrainConfig.lora) replaced by its own, prefixed (--lora-r,
    key lora_r). `only` / `skip` name keys, or a nested config's field for all of its keys."""
    out = []
    for s in field_infos(cls).values():
        inner = [_nested(s, i) for i in flat_fields(s.type)] if dataclasses.is_dataclass(s.type) else [s]
        out += [i for i in inner if _chosen(i, only, skip)]
    return out


def _nested(outer: FieldInfo, inner: FieldInfo) -> FieldInfo:
    path = (*outer.path, *inner.path)
    return dataclasses.replace(inner, path=path, flag=f"--{'-'.join(path).replace('_', '-')}")


def _chosen(s: FieldInfo, only: Collection[str] | None, skip: Collection[str]) -> bool:
    names = {s.key, s.path[0]}
    return (only is None or bool(names & set(only))) and not names & set(skip)


def value_of(config: Any, s: FieldInfo) -> Any:
    """The value of field `s` in `config` (an instance of the class it was read from)."""
    return functools.reduce(getattr, s.path, config)


def add_config_args(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    defaults: Any = None,
    *,
    only: Collection[str] | None = None,
    skip: Collection[str] = (),
    notes: Mapping[str, str] | None = None,
) -> None:
    """A flag per field of `cls` (see `flat_fields` for `only` and `skip`), typed by the field: a bool as --x and
    --no-x, a tuple as one or more values, a Literal or described choices as choices; helped by the field's help and
    `notes[key]`. `defaults`: an instance of cls, whose values the flags default to; DECLARED: the fields' declared
    defaults (where cls has required fields, so no instance to give; add none of those); None: every flag defaults
    to None (not given), its help saying the field's default, so config_args returns only what the command line
    set."""
    for s in flat_fields(cls, only=only, skip=skip):
        kw: dict[str, Any] = {"dest": s.dest}
        if s.item not in SCALARS:
            raise TypeError(f"{cls.__name__}.{s.key}: a {s.type} field has no flag; skip it and add one by hand.")
        if s.type is bool:
            kw["action"] = argparse.BooleanOptionalAction
        else:
            kw.update(type=s.item, choices=s.choices or None, nargs="+" if s.is_tuple else None)
        help = " ".join(filter(None, [s.help, (notes or {}).get(s.key, "")]))
        if defaults is None:
            help += f" (default {_shown(s.default)})"
        kw["default"] = _flag_default(cls, s, defaults)
        parser.add_argument(s.flag, help=help.replace("%", "%%"), **kw)  # argparse %-formats help


def _flag_default(cls: type, s: FieldInfo, defaults: Any) -> Any:
    if defaults is None:
        return None
    if defaults is not DECLARED:
        return value_of(defaults, s)
    if s.default is dataclasses.MISSING:
        raise TypeError(f"{cls.__name__}.{s.key} has no declared default: give its flag by hand, or an instance.")
    return s.default


def _shown(default: Any) -> str:
    """A default as a flag's help says it: a tuple's items, "none" for None or an empty tuple, '' for an empty str."""
    if isinstance(default, tuple):
        return " ".join(map(str, default)) or "none"
    return "none" if default is None else "''" if default == "" else str(default)


def config_args(
    args: argparse.Namespace, cls: type, *, only: Collection[str] | None = None, skip: Collection[str] = ()
) -> dict[str, Any]:
    """The values of the flags add_config_args added for `cls`, by key (lora_r for a nested field), lists as tuples;
    a flag left at None (not given, or an optional field's default) is left out."""
    out = {}
    for s in flat_fields(cls, only=only, skip=skip):
        value = getattr(args, s.dest)
        if value is not None:
            out[s.key] = tuple(value) if s.is_tuple else value
    return out


def config_argv(
    config: Any, *, always: Collection[str] = (), only: Collection[str] | None = None, skip: Collection[str] = ()
) -> list[str]:
    """The flags that give `config` back through add_config_args and config_args: every setting whose value differs
    from its declared default, and those whose keys `always` names. A None or an empty tuple (the default of every
    such field) is not spelled: no flag says it."""
    argv: list[str] = []
    for s in flat_fields(type(config), only=only, skip=skip):
        value = value_of(config, s)
        if (value == s.default and s.key not in always) or value is None or value == ():
            continue
        if s.type is bool:
            argv.append(s.flag if value else f"--no-{s.flag[2:]}")
        elif s.is_tuple:
            argv += [s.flag, *map(str, value)]
        else:
            argv += [s.flag, repr(value) if isinstance(value, float) else str(value)]
    return argv
