"""Check YAML read with positions against JSON Schemas: the stacks, rules and instances files'
schemas in ``matrix/model/schemas/`` and each component's ``images/<component>/options.schema.yaml``.

The instance table and the loader both use it, so it sits below both of them. A problem is one
:class:`~matrix.errors.UserError` as ``file:line: key: problem``.

A document that passed is remembered (``settings.remember_pass``, folder ``schema-passes``),
keyed by the digest of everything the verdict depends on: the document's data, the schema, the
jsonschema release and ``PASS_FORMAT``. The next command that checks the same data against the
same schema skips the check and the import of jsonschema (together about 0.3 s of every command's 0.9 s on the
2-core machine). A change to any of them is a new key, so it is checked again; a failure is
never remembered.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from matrix.errors import UserError, excerpt
from matrix.model import yamlsrc
from matrix.model.settings import IMAGES, passed_before, remember_pass

if TYPE_CHECKING:
    import jsonschema

SCHEMAS = Path(__file__).parent / "schemas"
# jsonschema (and what it imports) is loaded by the first check, not at import: shell completion
# (`invoke stacks --names`, `invoke --complete`) imports this package on every Tab and checks
# nothing, so it must not pay for it.
# The optional modules jsonschema's format checks use (jsonschema/_format.py imports each at
# module level when it is installed; cyclonedx-python-lib's json-validation extra installs them
# all). No validator this project runs in-process is given a format checker (a test holds it),
# so none of them checks anything here; importing them cost every command about 2 s
# (rfc3987_syntax compiles 38 lark grammars) and then 0.1 s (arrow, isoduration, ...).
FORMAT_MODULES = ("rfc3987_syntax", "rfc3987", "rfc3986_validator", "rfc3339_validator", "fqdn",
                  "idna", "webcolors", "jsonpointer", "uri_template", "isoduration")


def jsonschema_library():  # noqa: ANN201 (the jsonschema module, imported lazily)
    """The jsonschema module, imported without its optional format modules (``FORMAT_MODULES``).

    The first import here hides each of them that is not loaded yet (an import of a module
    whose ``sys.modules`` entry is None raises ImportError, which jsonschema expects of a
    module that is not installed), then unhides them: a later import of one works as usual.
    The bill of materials, whose CycloneDX schema is checked with formats, is validated in a
    process of its own (matrix/image/sbom.py).
    """
    if "jsonschema" in sys.modules:
        import jsonschema

        return jsonschema
    hidden = [name for name in FORMAT_MODULES if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        import jsonschema
    finally:
        for name in hidden:
            del sys.modules[name]
    return jsonschema


@cache
def schema(name: str) -> dict[str, Any]:
    return yamlsrc.load_shipped((SCHEMAS / f"{name}.schema.yaml").read_text(encoding="utf-8"))


# --- passes remembered ----------------------------------------------------------------------------

PASS_FORMAT = 1  # bump when what a check means changes (the validator class, the keywords used)


PASSES = "schema-passes"  # the user_cache folder


@cache
def _validator_release() -> str:
    """The installed jsonschema's release, read from its dist-info folder's name without
    importing it (an import is what a remembered pass saves)."""
    spec = importlib.util.find_spec("jsonschema")
    if spec is None or spec.origin is None:
        return "none"
    package = Path(spec.origin).parent
    found = sorted(p.name for p in package.parent.glob("jsonschema-*.dist-info"))
    return ",".join(found) or f"{package}@{package.stat().st_mtime_ns}"


def _pass_key(*parts: Any) -> str:
    """The digest a pass of ``parts`` is remembered by. ``repr`` tells 1 from "1" (JSON would not)."""
    text = repr((PASS_FORMAT, _validator_release(), parts))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def check_schema(located: yamlsrc.Located, schema_name: str) -> None:
    """Raise the first schema error (in document order) as ``file:line: key: problem``; a file
    that passes is remembered parsed for the next command (``Located.remember``)."""
    key = _pass_key("document", schema(schema_name), located.data)
    if not passed_before(PASSES, key):
        _first_schema_error(located, schema_name)
        remember_pass(PASSES, key)
    located.remember()


def _first_schema_error(located: yamlsrc.Located, schema_name: str) -> None:
    jsonschema = jsonschema_library()
    validator = jsonschema.Draft202012Validator(schema(schema_name))
    errors = list(validator.iter_errors(located.data))
    if not errors:
        return
    first = min(errors, key=lambda e: (located.where(e.absolute_path), len(e.absolute_path)))
    first = jsonschema.exceptions.best_match([first])
    key = "/".join(key_text(p) for p in first.absolute_path) or "(top level)"
    raise UserError(f"{located.where(first.absolute_path)}: {key}: {_describe(first)}")


OPTIONS_SCHEMA = "options.schema.yaml"


def check_options(located: yamlsrc.Located, images: Path | None = None) -> None:
    """Each component version's ``options`` against ``images/<component>/options.schema.yaml``,
    and each stack's options for a layer, over its version's, against the same schema.

    Runs before any template sees the options. A component without that file takes no options.
    """
    folder = images or IMAGES
    checked = {component: (_schema_text(folder / component / OPTIONS_SCHEMA),
                           {version: ("options" in vspec, vspec.get("options"))
                            for version, vspec in cspec["versions"].items()})
               for component, cspec in located.data["components"].items()}
    key = _pass_key("options", checked, list(_stack_layer_options(located.data)))
    if passed_before(PASSES, key):
        return
    _check_each_options(located, folder)
    _check_stack_layer_options(located, folder)
    remember_pass(PASSES, key)


def _schema_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not a valid JSON Schema: {exc}") from None


def _check_each_options(located: yamlsrc.Located, images: Path) -> None:
    for component, cspec in located.data["components"].items():
        for version, vspec in cspec["versions"].items():
            if "options" in vspec or options_schema(images / component / OPTIONS_SCHEMA) is not None:
                _require_valid_options(located, ("components", component, "versions", version,
                                                  "options"), component,
                                       vspec.get("options", {}), images)


def _require_valid_options(located: yamlsrc.Located, here: tuple, component: str,
                           options: dict[str, Any], images: Path,
                           own: dict[str, Any] | None = None) -> None:
    """``options`` (at ``here`` in the file) against ``images/<component>/options.schema.yaml``,
    the first error as one line; a component without that file takes none. Where the options are
    a stack's ``own`` merged over its version's, an error in a key of the version's is placed at
    the stack's entry (``here``), not inside it."""
    rule = options_schema(images / component / OPTIONS_SCHEMA)
    if rule is None:
        raise UserError(f"{located.where(here)}: {'/'.join(map(key_text, here))}: component "
                        f"{component} takes no options (it has no "
                        f"images/{component}/{OPTIONS_SCHEMA})")
    jsonschema = jsonschema_library()
    errors = list(jsonschema.Draft202012Validator(rule).iter_errors(options))
    if errors:
        first = jsonschema.exceptions.best_match(errors)
        path = tuple(first.absolute_path)
        at = here + path if own is None or (path and path[0] in own) else here
        raise UserError(f"{located.where(at)}: {'/'.join(map(key_text, at))}: "
                        f"{_describe(first)} [images/{component}/{OPTIONS_SCHEMA}]")


def layer_entry(entry: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """A stack's layer entry, in either form the schema allows, as (component, version, the
    stack's own options): ``python: "3.11.2"`` or ``python: {version: "3.11.2", options: {...}}``."""
    (component, written), = entry.items()
    if isinstance(written, dict):
        return component, written["version"], written["options"]
    return component, written, {}


def _stack_layer_options(data: dict[str, Any]) -> Iterator[tuple[str, int, str, str, dict]]:
    """(stack, layer index, component, version, the stack's options) for every layer a stack
    gives options of its own."""
    for stack, spec in data["stacks"].items():
        for index, entry in enumerate(spec["layers"]):
            component, version, options = layer_entry(entry)
            if options:
                yield stack, index, component, version, options


def _check_stack_layer_options(located: yamlsrc.Located, images: Path) -> None:
    """A stack's options for a layer, merged over its version's, must pass the component's
    schema; an unknown component or version is left to the loader, which names it."""
    components = located.data["components"]
    for stack, index, component, version, options in _stack_layer_options(located.data):
        vspec = components.get(component, {}).get("versions", {}).get(version)
        if vspec is not None:
            _require_valid_options(located, ("stacks", stack, "layers", index, component,
                                             "options"), component,
                                   {**(vspec.get("options") or {}), **options}, images, own=options)


@cache
def options_schema(path: Path) -> dict[str, Any] | None:
    """A component's options schema; None when the component has none (it takes no options)."""
    jsonschema = jsonschema_library()
    if not path.is_file():
        return None
    try:
        rule = yamlsrc.load_shipped(path.read_text(encoding="utf-8"))
        jsonschema.Draft202012Validator.check_schema(rule)
    except (yaml.YAMLError, jsonschema.exceptions.SchemaError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not a valid JSON Schema: "
                        f"{' '.join(str(exc).split())[:200]}") from None
    return rule


def _describe(error: jsonschema.ValidationError) -> str:
    """A short, human sentence for a schema error."""
    described = error.schema.get("description", "") if isinstance(error.schema, dict) else ""
    if error.validator == "pattern":
        hint = " (quote versions such as \"10.1\")" if "version" in described.lower() else ""
        return f"{excerpt(error.instance)} does not match {error.validator_value!r}{hint}"
    if error.validator == "type":
        hint = f"; {described}" if described else ""
        return f"expected {error.validator_value}, got {_kind(error.instance)}{hint}"
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(allowed))
        return f"unknown key(s) {', '.join(map(str, extra))}; allowed: {', '.join(allowed) or 'none'}"
    # jsonschema's own messages quote the whole value; quote an excerpt instead.
    return error.message.replace(repr(error.instance), excerpt(error.instance))


def key_text(key: Any) -> str:
    """One key of a path in an error line; a huge key is shortened like any quoted value."""
    text = str(key)
    return text if len(text) <= 40 else excerpt(text)


def _kind(value: Any) -> str:
    if value is None:
        return "nothing"
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)

