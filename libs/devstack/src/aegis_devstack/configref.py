"""``python -m aegis_devstack.configref``: the configuration reference, from the settings classes.

Writes ``docs/configuration-reference.md`` (every ``AEGIS_*`` variable: who reads it, its type,
default and meaning) and :mod:`aegis_runtime.settings_names` (the names a process checks its
environment against at start, :mod:`aegis_runtime.envcheck`). Run it from the repository root
after changing a setting; ``--check`` writes nothing and exits 1 when either file is out of date.

Which settings a component reads comes from the installed AEGIS packages' entry points: every
``aegis.services`` entry point is a service and every ``aegis.commands`` one an ``aegis``
subcommand, and its settings class is the most derived :class:`AegisSettings` subclass its module
uses (defines or imports). The services are imported only when the generator runs, never when
this module is imported: the runtime does not depend on them.

The meaning of a variable is its field's ``description``; a renamed variable lists its old names
after the new one in ``validation_alias=AliasChoices(...)``; a variable read outside the settings
classes (a job's own variables, an option's environment variable, the tests') is in
:data:`OTHER_VARIABLES`.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import json
import sys
import types
import typing
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import NoDecode

import aegis_runtime
from aegis_runtime.settings import AegisSettings

PREFIX = "AEGIS_"
REFERENCE = Path("docs") / "configuration-reference.md"
# written into aegis_runtime, which every process imports to check its environment at start
NAMES_MODULE = Path(aegis_runtime.__file__).with_name("settings_names.py")
COMMAND = "python -m aegis_devstack.configref"
EVERY_COMPONENT = "every component"

Kind = Literal["service", "command"]


class ConfigRefError(Exception):
    """The settings break a rule the reference relies on (one name per meaning, a description)."""


@dataclass(frozen=True, slots=True)
class Component:
    """A service (``processor``) or an ``aegis`` subcommand (``report``) and its settings."""

    name: str
    kind: Kind
    settings: type[AegisSettings]

    @property
    def label(self) -> str:
        return self.name if self.kind == "service" else f"aegis {self.name}"


@dataclass(frozen=True, slots=True)
class OtherVariable:
    """A variable read outside the settings classes; a name ending in ``*`` is a family."""

    name: str
    readers: str
    default: str
    meaning: str
    development: bool = False

    @property
    def prefix(self) -> str | None:
        return self.name[:-1] if self.name.endswith("*") else None


OTHER_VARIABLES: tuple[OtherVariable, ...] = (
    OtherVariable(
        "AEGIS_JOB_*",
        "orchestrator",
        "unset",
        "Values a job's ENVIRONMENT parameters may read (`${AEGIS_JOB_SAFETY_SLACK_URL}`: the "
        "webhook URLs of jobs); a job can read no other variable. "
        "`AEGIS_JOB_EGRESS_ALLOW` is a setting of the orchestrator, not readable by jobs.",
    ),
    OtherVariable(
        "AEGIS_BROKER_PASSWORD_FILE",
        "aegis devices",
        "unset",
        "The broker's password file that `aegis devices` edits (its `--password-file`).",
    ),
    OtherVariable(
        "AEGIS_BROKER_ACL_FILE",
        "aegis devices",
        "unset",
        "The broker's ACL file that `aegis devices` edits (its `--acl-file`).",
    ),
    OtherVariable(
        "AEGIS_UP_FIRST_HEALTH_PORT",
        "aegis up",
        "8101",
        "The health port of the first service `aegis up` starts; the others count up from it. "
        "0: any free port for each.",
        development=True,
    ),
    OtherVariable(
        "AEGIS_MOTO_LATENCY_MS",
        "aegis up",
        "0",
        "Milliseconds the local S3 and DynamoDB emulator adds to every request (benchmarks).",
        development=True,
    ),
    OtherVariable(
        "AEGIS_TEST_*",
        "tests",
        "unset",
        "`AEGIS_TEST_AWS_ENDPOINT`, `AEGIS_TEST_MQTT_URL` and `AEGIS_TEST_NATS_URL` point the "
        "tests at servers that already run; `AEGIS_TEST_HYGIENE=off` turns off the check for "
        "files and ports a test leaves behind.",
        development=True,
    ),
    OtherVariable(
        "AEGIS_LOCALSTACK_IMAGE",
        "tests",
        "the pinned image",
        "The LocalStack image of the tests' S3 and DynamoDB container.",
        development=True,
    ),
    OtherVariable(
        "AEGIS_MOSQUITTO_IMAGE",
        "tests",
        "the pinned image",
        "The Mosquitto image of the tests' broker container.",
        development=True,
    ),
    OtherVariable(
        "AEGIS_NATS_IMAGE",
        "tests",
        "the pinned image",
        "The NATS image of the tests' JetStream container.",
        development=True,
    ),
    OtherVariable(
        "AEGIS_NPM_CACHE",
        "tests",
        "`~/.cache/aegis-npm`",
        "Where the jobs' tests install the npm validator of Amazon States Language.",
        development=True,
    ),
)


# -- discovery ----------------------------------------------------------------------------------


def _settings_classes(values: Iterable[object]) -> set[type[AegisSettings]]:
    return {v for v in values if isinstance(v, type) and issubclass(v, AegisSettings)}


def _imported(module: types.ModuleType) -> list[object]:
    """What ``module`` imports by name anywhere in its source: at the top, under
    ``TYPE_CHECKING`` or inside a function (a command module that imports lazily)."""
    try:
        source = inspect.getsource(module)
    except (OSError, TypeError):  # no source (built without it): what it holds is all there is
        return []
    found: list[object] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            origin = importlib.import_module(node.module)
            found += [getattr(origin, a.name, None) for a in node.names]
    return found


def settings_class_of(module: types.ModuleType) -> type[AegisSettings]:
    """The most derived settings class ``module`` defines or imports."""
    found = _settings_classes([*vars(module).values(), *_imported(module)])
    leaves = [c for c in found if not any(o is not c and issubclass(o, c) for o in found)]
    if len(leaves) != 1:
        names = sorted(c.__qualname__ for c in leaves)
        raise ConfigRefError(
            f"{module.__name__}: uses {names or 'no settings class'}; it must use exactly one "
            "AegisSettings subclass (or AegisSettings itself)"
        )
    return leaves[0]


def discover() -> list[Component]:
    """Every installed service and ``aegis`` subcommand with its settings class."""
    components = []
    groups: tuple[tuple[str, Kind], ...] = (
        ("aegis.services", "service"),
        ("aegis.commands", "command"),
    )
    for group, kind in groups:
        for ep in entry_points(group=group):
            module = importlib.import_module(ep.module)
            components.append(Component(ep.name, kind, settings_class_of(module)))
    return sorted(components, key=lambda c: (c.kind != "service", c.name))


# -- one variable -------------------------------------------------------------------------------


def env_names(name: str, info: FieldInfo) -> tuple[str, tuple[str, ...]]:
    """(the variable, its deprecated names) of field ``name``."""
    current = PREFIX + name.upper()
    alias = info.validation_alias
    if alias is None:
        return current, ()
    choices = alias.choices if isinstance(alias, AliasChoices) else [alias]
    if not all(isinstance(c, str) for c in choices) or choices[0] != current:
        raise ConfigRefError(
            f"{name}: validation_alias must be AliasChoices({current!r}, <old names>...), "
            f"not {alias!r}"
        )
    return current, tuple(str(c) for c in choices[1:])


def _bare(annotation: Any) -> Any:
    """The annotation without ``| None`` (an optional setting's default is "unset")."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0] if len(rest) == 1 else annotation
    return annotation


def _comma_separated(info: FieldInfo) -> bool:
    return any(m is NoDecode or isinstance(m, NoDecode) for m in info.metadata)


def _number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _constraint(info: FieldInfo, *names: str) -> tuple[str, Any] | None:
    """The first of ``names`` set in ``Field(...)`` (pydantic keeps them in ``metadata``)."""
    for m in info.metadata:
        for name in names:
            if (value := getattr(m, name, None)) is not None:
                return name, value
    return None


def _bounds(info: FieldInfo, what: str) -> str:
    """``1 to 256``, ``> 0``, ``at most 128 characters``: the constraints of a field."""
    if what == "number":
        low, high = _constraint(info, "ge", "gt"), _constraint(info, "le", "lt")
        if low and high and (low[0], high[0]) == ("ge", "le"):
            return f"{_number(low[1])} to {_number(high[1])}"
        signs = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<"}
        return ", ".join(f"{signs[b[0]]} {_number(b[1])}" for b in (low, high) if b)
    unit = "characters" if what == "text" else "items"
    least, most = _constraint(info, "min_length"), _constraint(info, "max_length")
    if least and most:
        return f"{least[1]} to {most[1]} {unit}"
    if most:
        return f"at most {most[1]} {unit}"
    if least:
        return "not empty" if least[1] == 1 else f"at least {least[1]} {unit}"
    return ""


def _base_type(annotation: Any, comma: bool) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return "one of " + ", ".join(f"`{a}`" for a in args)
    if origin is list:
        item = _base_type(args[0], comma) if args else "text"
        item = item.removeprefix("one of ")
        return f"{'comma-separated' if comma else 'JSON'} list of {item}"
    if origin is dict:
        return f"JSON object of {_base_type(args[1], comma)}"
    simple = {
        str: "text",
        int: "integer",
        float: "number",
        bool: "true/false",
        Path: "path",
        SecretStr: "secret text",
    }
    if annotation in simple:
        return simple[annotation]
    raise ConfigRefError(f"no reference type for {annotation!r}")


def type_text(info: FieldInfo) -> str:
    annotation = _bare(info.annotation)
    text = _base_type(annotation, _comma_separated(info))
    origin = typing.get_origin(annotation)
    what = "list" if origin is list else "number" if annotation in (int, float) else "text"
    bounds = _bounds(info, what)
    return f"{text}, {bounds}" if bounds else text


def _value_text(value: Any, comma: bool) -> str:
    """A default as an operator writes it: numbers plain, anything else as code."""
    if value is None:
        return "unset"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return _number(value)
    if isinstance(value, bool):
        text = str(value).lower()
    elif isinstance(value, list) and comma:
        text = ",".join(str(v) for v in value)
    elif isinstance(value, list | dict) and value:
        text = json.dumps(value, separators=(",", ":"))
    else:
        text = "" if isinstance(value, list) else str(value)
    return f"`{text}`" if text else "empty"


def default_text(info: FieldInfo) -> str:
    extra = info.json_schema_extra
    if isinstance(extra, dict) and isinstance(extra.get("default_doc"), str):
        return str(extra["default_doc"])
    if info.is_required():
        return "required"
    value = info.get_default(call_default_factory=True, validated_data={})
    return _value_text(value, _comma_separated(info))


def meaning(owner: str, name: str, info: FieldInfo) -> str:
    if not info.description or not info.description.strip():
        raise ConfigRefError(f"{owner}.{name} has no description: say what it means for operators")
    return " ".join(info.description.split())


@dataclass(slots=True)
class Variable:
    name: str
    attribute: str
    value_type: str
    default: str
    meaning: str
    deprecated: tuple[str, ...]
    classes: list[type[AegisSettings]] = field(default_factory=list)
    # a shared setting's defaults in the components that override it: default -> their names
    # (``AEGIS_SERVICE``: each component's own name; ``AEGIS_AWS_MAX_ATTEMPTS``: ingest's 3)
    overridden: dict[str, set[str]] = field(default_factory=dict)


# -- the model of the reference -----------------------------------------------------------------


@dataclass(slots=True)
class Reference:
    components: list[Component]
    shared: list[Variable]
    own: dict[type[AegisSettings], list[Variable]]
    several: list[Variable]

    def group(self, cls: type[AegisSettings]) -> str:
        """A class's section: the name its processes report (``service``'s default)."""
        return str(cls.model_fields["service"].default)

    def readers(self, cls: type[AegisSettings]) -> list[Component]:
        return [c for c in self.components if c.settings is cls]

    def names(self) -> set[str]:
        return {v.name for v in self.variables()}

    def variables(self) -> list[Variable]:
        return [*self.shared, *self.several, *(v for vs in self.own.values() for v in vs)]

    def deprecated(self) -> dict[str, list[Variable]]:
        """Deprecated name -> the variables that replace it (one per meaning)."""
        found: dict[str, list[Variable]] = {}
        for v in self.variables():
            for old in v.deprecated:
                found.setdefault(old, []).append(v)
        return {old: sorted(vs, key=lambda v: v.name) for old, vs in sorted(found.items())}

    def readers_text(self, v: Variable) -> str:
        """The services and commands that read ``v``, for the reference."""
        if AegisSettings in v.classes:
            return EVERY_COMPONENT
        return _labels(c for c in self.components if c.settings in v.classes)

    def groups_text(self, v: Variable) -> str:
        """The names of the processes that read ``v`` (their ``AEGIS_SERVICE``), for the logs."""
        if AegisSettings in v.classes:
            return EVERY_COMPONENT
        return ", ".join(sorted(self.group(c) for c in v.classes))


def _variable(owner: type[AegisSettings], name: str, info: FieldInfo) -> Variable:
    env, old = env_names(name, info)
    return Variable(
        name=env,
        attribute=name,
        value_type=type_text(info),
        default=default_text(info),
        meaning=meaning(owner.__qualname__, name, info),
        deprecated=old,
        classes=[owner],
    )


def build(components: Sequence[Component]) -> Reference:
    """The reference of ``components``; raises :class:`ConfigRefError` when a name means two
    things (declared by several classes with another type, default or meaning) or a field has no
    description."""
    base = AegisSettings.model_fields
    shared = [_variable(AegisSettings, n, i) for n, i in base.items()]
    by_field = {v.attribute: v for v in shared}
    classes = sorted({c.settings for c in components} - {AegisSettings}, key=lambda c: c.__name__)
    own: dict[type[AegisSettings], list[Variable]] = {}
    declared: dict[str, Variable] = {}
    for cls in classes:
        for name, info in cls.model_fields.items():
            if name in base:
                if (default := default_text(info)) != by_field[name].default:
                    by_field[name].overridden.setdefault(default, set()).update(
                        c.name for c in components if c.settings is cls
                    )
                continue
            var = _variable(cls, name, info)
            if (earlier := declared.get(name)) is None:
                declared[name] = var
                own.setdefault(cls, []).append(var)
                continue
            mine = (var.value_type, var.default, var.meaning, var.deprecated)
            theirs = (earlier.value_type, earlier.default, earlier.meaning, earlier.deprecated)
            if mine != theirs:
                raise ConfigRefError(
                    f"{var.name} means different things to {earlier.classes[0].__qualname__} and "
                    f"{cls.__qualname__} (type, default, description or old names differ): one "
                    "name per meaning, so give each its own service prefix"
                )
            earlier.classes.append(cls)
    several = [v for v in declared.values() if len(v.classes) > 1]
    for cls, variables in own.items():
        own[cls] = [v for v in variables if len(v.classes) == 1]
    return Reference(list(components), shared, {c: vs for c, vs in own.items() if vs}, several)


# -- rendering ----------------------------------------------------------------------------------


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _row(*cells: str) -> str:
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def _labels(components: Iterable[Component]) -> str:
    """E.g. `` `processor` and `aegis report` ``: services by name, commands as typed."""
    labels = [f"`{c.label}`" for c in components]
    return " and ".join([", ".join(labels[:-1]), labels[-1]] if len(labels) > 1 else labels)


def _default_cell(v: Variable) -> str:
    if not v.overridden:
        return v.default
    if v.attribute == "service":  # each component's own name
        return f"{v.default}; in each component its own: {', '.join(sorted(v.overridden))}"
    others = (
        f"{', '.join(f'`{n}`' for n in sorted(names))}: {default}"
        for default, names in sorted(v.overridden.items())
    )
    return f"{v.default}; {'; '.join(others)}"


def render_reference(ref: Reference) -> str:
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated from the settings classes by "
        f"`{COMMAND}`: edit the descriptions there, not this page. -->",
        "",
        "Every `AEGIS_*` variable an AEGIS service or `aegis` command reads, with its type, "
        "default and meaning. How settings are read, where each platform keeps them and what "
        "happens to names no component reads: [configuration.md](configuration.md).",
        "",
        "Durations end in their unit: `_S` seconds, `_MS` milliseconds, `_HOURS`, `_DAYS`. "
        'Comma-separated lists are written `a,b`, JSON lists `["a","b"]`; true/false also '
        "accepts `1`/`0`. Unset: the variable is absent.",
        "",
        "## Every service and command",
        "",
        "Every AEGIS process reads these: all the services and every `aegis` command.",
        "",
        _row("variable", "type", "default", "meaning"),
        "|---|---|---|---|",
    ]
    lines += [_row(f"`{v.name}`", v.value_type, _default_cell(v), v.meaning) for v in ref.shared]
    if ref.several:
        lines += [
            "",
            "## Shared by some services",
            "",
            "Read by more than one component with one meaning: set them the same for all.",
            "",
            _row("variable", "read by", "type", "default", "meaning"),
            "|---|---|---|---|---|",
        ]
        lines += [
            _row(f"`{v.name}`", ref.readers_text(v), v.value_type, v.default, v.meaning)
            for v in ref.several
        ]
    for cls in sorted(ref.own, key=ref.group):
        lines += [
            "",
            f"## {ref.group(cls)}",
            "",
            f"Read by {_labels(ref.readers(cls))}.",
            "",
            _row("variable", "type", "default", "meaning"),
            "|---|---|---|---|",
        ]
        lines += [_row(f"`{v.name}`", v.value_type, v.default, v.meaning) for v in ref.own[cls]]
    for title, intro, development in (
        (
            "Read outside the settings",
            "Variables a component reads besides its settings.",
            False,
        ),
        (
            "Development and tests",
            "Read by `aegis up` (the local stack, a development install only) and by the tests.",
            True,
        ),
    ):
        lines += [
            "",
            f"## {title}",
            "",
            intro,
            "",
            _row("variable", "read by", "default", "meaning"),
            "|---|---|---|---|",
        ]
        lines += [
            _row(f"`{o.name}`", o.readers, o.default, o.meaning)
            for o in OTHER_VARIABLES
            if o.development == development
        ]
    deprecated = ref.deprecated()
    if deprecated:
        lines += [
            "",
            "## Deprecated names",
            "",
            "These names still work for one release; a process that finds one logs "
            "`deprecated_setting` with its replacement at start. When both are set, the new "
            "name wins.",
            "",
            _row("deprecated", "use instead", "read by"),
            "|---|---|---|",
        ]
        for old, replacements in deprecated.items():
            lines += [_row(f"`{old}`", f"`{v.name}`", ref.readers_text(v)) for v in replacements]
    return "\n".join(lines) + "\n"


def _string_block(values: Iterable[str], indent: str) -> list[str]:
    return [f'{indent}"{v}",' for v in values]


def render_names(ref: Reference) -> str:
    known = sorted(ref.names() | {o.name for o in OTHER_VARIABLES if o.prefix is None})
    prefixes = sorted(o.prefix for o in OTHER_VARIABLES if o.prefix is not None)
    lines = [
        '"""The ``AEGIS_*`` names AEGIS components read: what :mod:`aegis_runtime.envcheck` checks.',
        "",
        f"Written by ``{COMMAND}`` from the settings classes: do not edit.",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "# every current name: each component's settings and the variables read besides them",
        "KNOWN: frozenset[str] = frozenset(",
        "    {",
        *_string_block(known, "        "),
        "    }",
        ")",
        "# any name under these prefixes is known too (a job's own variables, the tests')",
        "PREFIXES: tuple[str, ...] = (",
        *_string_block(prefixes, "    "),
        ")",
        "# deprecated name -> {its replacement: the processes that read it}",
        "DEPRECATED: dict[str, dict[str, str]] = {",
    ]
    for old, replacements in ref.deprecated().items():
        lines.append(f'    "{old}": {{')
        lines += [f'        "{v.name}": "{ref.groups_text(v)}",' for v in replacements]
        lines.append("    },")
    lines.append("}")
    return "\n".join(lines) + "\n"


# -- the command --------------------------------------------------------------------------------


def outputs(root: Path) -> dict[Path, str]:
    """What the generator writes, by path: the reference under ``root``, and the names module."""
    ref = build(discover())
    return {root / REFERENCE: render_reference(ref), NAMES_MODULE: render_names(ref)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=COMMAND,
        description=f"Write {REFERENCE} and aegis_runtime/settings_names.py from the settings "
        "of every installed AEGIS service and command.",
    )
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 when a file is out of date"
    )
    parser.add_argument(
        "--root", type=Path, default=Path(), help="the repository root (default: here)"
    )
    args = parser.parse_args(argv)
    if not (args.root / "docs").is_dir():
        parser.error(f"{args.root.resolve()} has no docs/: run it from the repository root")
    try:
        wanted = outputs(args.root)
    except ConfigRefError as err:
        print(f"configref: {err}", file=sys.stderr)
        return 2
    stale = [p for p, text in wanted.items() if not p.exists() or p.read_text() != text]
    if args.check:
        for path in stale:
            print(f"configref: {path} is out of date; run `{COMMAND}`", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(wanted[path])
        print(f"configref: wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
