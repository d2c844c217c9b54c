"""Read YAML while remembering where every value came from, within fixed bounds.

Schema and rule errors must point at ``file:line``. PyYAML's ``safe_load`` forgets positions, so
we compose the node tree, record each node's line under its JSON path, and construct plain data
from the same tree. Duplicate mapping keys, which YAML silently collapses, are reported too.

A stacks file is untrusted input (a pull request may change it), so reading it is bounded: every
limit below ends in one :class:`UserError` line, never a ``RecursionError``, a hang or unbounded
memory.

- **Aliases.** An alias that refers to a node that contains it (``&r [*r]``) is refused; aliases
  are expanded into copies, and the expanded document may hold at most :data:`MAX_NODES` values,
  so an alias bomb (each level doubling the last) stops at the limit instead of growing forever.
- **Nesting** deeper than :data:`MAX_DEPTH` is refused while composing (PyYAML's composer
  recurses once per level) and again after alias expansion.
- **Size.** The file may be at most :data:`MAX_FILE_BYTES`, one value at most
  :data:`MAX_VALUE_CHARS`.
- **Tags.** Only JSON's kinds of data: strings, integers, floats, booleans, null, lists and
  mappings. An explicit tag (``!!int x``) must fit its value; any other tag (``!!timestamp``,
  ``!!binary``, ``!!set``, ``!custom``) is refused. Plain dates stay strings.
- **Encoding.** The file must be UTF-8; a bad byte is reported with its line and offset.

Error lines quote at most a short excerpt of a bad value (:func:`matrix.errors.excerpt`).

A file that passed its schema is remembered parsed, as JSON, in the user's cache (:data:`PARSED`),
and the next command reads that instead of composing it again.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError, SafeConstructor

from matrix.errors import UserError, excerpt
from matrix.model.settings import cached_json, remember_text

JsonPath = tuple[Any, ...]

MAX_DEPTH = 64  # stacks.yaml nests 7 levels; templates never need more than a handful
MAX_NODES = 100_000  # stacks.yaml holds about 1,500 values
MAX_FILE_BYTES = 4 * 1024 * 1024
MAX_VALUE_CHARS = 64 * 1024

_TAG = "tag:yaml.org,2002:"
_SCALAR_TAGS = {_TAG + name for name in ("str", "int", "float", "bool", "null")}
_COLLECTION_TAGS = {yaml.MappingNode: _TAG + "map", yaml.SequenceNode: _TAG + "seq"}


@dataclass
class Located:
    """Parsed YAML data plus the line of every node, keyed by its JSON path."""

    path: Path
    data: Any
    lines: dict[JsonPath, int] = field(default_factory=dict)
    cache_name: str = ""  # the entry of this text in PARSED ("": none)
    from_cache: bool = False

    def where(self, json_path: JsonPath | list[Any] = ()) -> str:
        """``file:line`` of the deepest node on ``json_path`` that the file actually has."""
        probe = tuple(json_path)
        while probe and probe not in self.lines:
            probe = probe[:-1]
        line = self.lines.get(probe)
        return f"{self.path}:{line}" if line else str(self.path)

    def remember(self) -> None:
        """Keep this parse in :data:`PARSED` for the next command (check_schema calls it once the
        file passed its schema, so broken or hostile files leave nothing there). Skipped where
        JSON would not give the same data back: a mapping key that is not a string, a NaN."""
        if not self.cache_name or self.from_cache:
            return
        entry = {"data": self.data, "lines": [[list(p), line] for p, line in self.lines.items()]}
        try:
            text = json.dumps(entry, separators=(",", ":"), ensure_ascii=False)
        except (TypeError, ValueError):
            return
        back = json.loads(text)
        if back["data"] != self.data or _lines(back["lines"]) != self.lines:
            return
        remember_text(PARSED, self.cache_name, text)


# The user's cache folder (matrix/model/settings.py) of files parsed here, as JSON: loading the
# matrix (stacks.yaml, rules.yaml, the instance table) took 0.137 s of CPU in one process, 0.063 s
# reading them from here; `invoke stacks` 0.795 s against 0.707 (bench/yaml_cache.py, medians of
# 20), and a test run starts about 550 commands. An entry
# is named by the sha256 of the text, this module's source and PyYAML's release, so an edited file
# or a changed reader is parsed again.
PARSED = "parsed-yaml"


@cache
def _reader_id() -> bytes:
    return hashlib.sha256(Path(__file__).read_bytes() + yaml.__version__.encode()).digest()


def _cache_name(text: str) -> str:
    digest = hashlib.sha256(_reader_id())
    digest.update(text.encode("utf-8", "surrogatepass"))
    return digest.hexdigest() + ".json"


def _lines(pairs: list[list[Any]]) -> dict[JsonPath, int]:
    return {tuple(path): line for path, line in pairs}


try:  # libyaml scans and parses about 7 times faster; composing stays in Python (bounded below)
    from yaml.cyaml import CParser as _Parser
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    from yaml.parser import Parser as _Parser
    from yaml.reader import Reader as _Reader
    from yaml.scanner import Scanner as _Scanner
else:
    _Reader = _Scanner = None


class _BoundedLoader(_Parser, yaml.composer.Composer, yaml.resolver.Resolver):
    """Events from libyaml (or PyYAML's parser), composed in Python with the recursion bounded.

    PyYAML's composer recurses once per nesting level, so the depth check sits there.
    """

    def __init__(self, stream: str) -> None:
        if _Reader is not None:  # the pure-Python parser reads through Reader and Scanner
            _Reader.__init__(self, stream)
            _Scanner.__init__(self)
            _Parser.__init__(self)
        else:
            _Parser.__init__(self, stream)
        yaml.composer.Composer.__init__(self)
        yaml.resolver.Resolver.__init__(self)
        self._depth = 0

    # CParser brings C versions of these; ours must run so the depth bound applies.
    get_single_node = yaml.composer.Composer.get_single_node
    compose_document = yaml.composer.Composer.compose_document

    def compose_node(self, parent: Any, index: Any) -> Any:
        if not self.check_event(yaml.SequenceStartEvent, yaml.MappingStartEvent):
            return yaml.composer.Composer.compose_node(self, parent, index)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise ComposerError(None, None, f"nesting deeper than {MAX_DEPTH} levels",
                                    self.peek_event().start_mark)
            return yaml.composer.Composer.compose_node(self, parent, index)
        finally:
            self._depth -= 1


# One constructor for every scalar; its methods only read the node they are given.
_CONSTRUCTOR = SafeConstructor()
_RESOLVER = yaml.resolver.Resolver()


def load_shipped(text: str) -> Any:
    """A YAML file the project ships (a schema, a vendored CRD): plain data, no line numbers,
    through libyaml's safe loader where PyYAML has it (about ten times faster than PyYAML's own;
    every CLI command reads a few dozen schemas)."""
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506


def load(path: Path) -> Located:
    """Parse ``path``; any read, encoding or syntax problem becomes a one-line :class:`UserError`."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise UserError(f"{path}: file is {size} bytes, over the limit of {MAX_FILE_BYTES}")
        raw = path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return loads(decode(raw, path), path)


def decode(raw: bytes, path: Path) -> str:
    """``raw`` as UTF-8, or one line naming the line and byte offset of the first bad byte."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise UserError(f"{path}:{line}: not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset "
                        f"{exc.start}); save the file as UTF-8") from None


def loads(text: str, path: Path) -> Located:
    """Parse YAML ``text`` that came from ``path``."""
    if len(text) > MAX_FILE_BYTES:
        raise UserError(f"{path}: {len(text)} characters, over the limit of {MAX_FILE_BYTES}")
    name = _cache_name(text)
    hit = cached_json(PARSED, name)
    if isinstance(hit, dict):
        try:
            return Located(path=path, data=hit["data"], lines=_lines(hit["lines"]),
                           cache_name=name, from_cache=True)
        except (KeyError, TypeError, ValueError):
            pass  # not an entry of ours: parse the text
    loader = None
    try:
        loader = _BoundedLoader(text)  # the pure-Python reader checks every character here
        root = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark else ""
        problem = exc.problem or exc.context or "invalid YAML"
        raise UserError(f"{path}{line}: invalid YAML: {problem}") from None
    except yaml.reader.ReaderError as exc:
        # libyaml counts positions in UTF-8 bytes and gives the character as a number.
        head = text.encode("utf-8", "surrogatepass")[:exc.position] if _Reader is None \
            else text[:exc.position]
        line = head.count(b"\n" if isinstance(head, bytes) else "\n") + 1
        character = chr(exc.character) if isinstance(exc.character, int) else exc.character
        raise UserError(f"{path}:{line}: invalid YAML: character {character!r} "
                        "is not allowed") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: invalid YAML: {' '.join(str(exc).split())}") from None
    except UnicodeEncodeError as exc:  # a lone surrogate in text that did not come from load()
        raise UserError(f"{path}: not valid Unicode text ({exc.reason})") from None
    finally:
        if loader is not None:
            loader.dispose()
    located = Located(path=path, data=None, cache_name=name)
    if root is None:
        return located
    located.data = _Builder(located).construct(root, ())
    return located


class _Builder:
    """Plain data from a node graph: aliases expanded as copies, within the limits above."""

    def __init__(self, located: Located) -> None:
        self.located = located
        self.nodes = 0
        self.open: set[int] = set()  # ids of the collection nodes on the current path

    def fail(self, node: yaml.Node, problem: str) -> UserError:
        return UserError(f"{self.located.path}:{node.start_mark.line + 1}: {problem}")

    def construct(self, node: yaml.Node, json_path: JsonPath) -> Any:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise self.fail(node, f"more than {MAX_NODES} values once aliases are expanded "
                                  "(an alias bomb?)")
        if len(json_path) > MAX_DEPTH:
            raise self.fail(node, f"nesting deeper than {MAX_DEPTH} levels once aliases "
                                  "are expanded")
        self.located.lines.setdefault(json_path, node.start_mark.line + 1)
        if isinstance(node, yaml.ScalarNode):
            return self.scalar(node)
        if node.tag != _COLLECTION_TAGS.get(type(node)):
            raise self.fail(node, f"unsupported YAML tag {_short_tag(node.tag)} (only plain "
                                  "strings, numbers, booleans, null, lists and mappings)")
        if id(node) in self.open:
            raise self.fail(node, "recursive alias: an anchored node contains an alias to itself")
        self.open.add(id(node))
        try:
            if isinstance(node, yaml.MappingNode):
                return self.mapping(node, json_path)
            return [self.construct(item, json_path + (i,)) for i, item in enumerate(node.value)]
        finally:
            self.open.discard(id(node))

    def mapping(self, node: yaml.MappingNode, json_path: JsonPath) -> dict[Any, Any]:
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _TAG + "merge":
                raise self.fail(key_node, "YAML merge keys (<<) are not supported")
            key = self.scalar(key_node) if isinstance(key_node, yaml.ScalarNode) else None
            if not isinstance(key, (str, int, float, bool)):
                raise self.fail(key_node, "mapping keys must be plain scalars")
            if key in result:
                raise self.fail(key_node, f"duplicate key {excerpt(key)}")
            result[key] = self.construct(value_node, json_path + (key,))
            # Point at the key's line: for a block value that is where a reader looks.
            self.located.lines[json_path + (key,)] = key_node.start_mark.line + 1
        return result

    def scalar(self, node: yaml.ScalarNode) -> Any:
        if len(node.value) > MAX_VALUE_CHARS:
            raise self.fail(node, f"value {excerpt(node.value)} is longer than the limit of "
                                  f"{MAX_VALUE_CHARS} characters")
        tag = node.tag
        if tag == _TAG + "timestamp" and _implicit_tag(node) == tag:
            return node.value  # a plain date stays the string it was written as
        if tag not in _SCALAR_TAGS:
            raise self.fail(node, f"unsupported YAML tag {_short_tag(tag)} on value "
                                  f"{excerpt(node.value)} (only plain strings, numbers, booleans "
                                  "and null)")
        if tag == _TAG + "str":
            return node.value
        if tag == _TAG + "null" and node.value not in ("", "~", "null", "Null", "NULL"):
            raise self.fail(node, f"{excerpt(node.value)} is not a valid !!null")
        try:
            return _CONSTRUCTOR.construct_object(node, deep=True)
        except (ConstructorError, ValueError, KeyError, AttributeError, TypeError,
                OverflowError, IndexError):
            raise self.fail(node, f"{excerpt(node.value)} is not a valid "
                                  f"{_short_tag(tag)}") from None
        finally:
            # The constructor caches every object it made; we keep nothing between scalars.
            _CONSTRUCTOR.constructed_objects.clear()
            _CONSTRUCTOR.recursive_objects.clear()


def _implicit_tag(node: yaml.ScalarNode) -> str:
    """The tag a plain scalar gets from its text alone (quoted scalars are always strings)."""
    if node.style:
        return _TAG + "str"
    return _RESOLVER.resolve(yaml.ScalarNode, node.value, (True, False))


def _short_tag(tag: str) -> str:
    text = "!!" + tag[len(_TAG):] if tag.startswith(_TAG) else tag
    return excerpt(text, 30).strip("'\"") if len(text) > 30 else text
