"""Read YAML while remembering where every value came from.

Schema and rule errors must point at ``file:line``. PyYAML's ``safe_load`` forgets positions, so
we compose the node tree, record each node's line under its JSON path, and construct plain data
from the same tree. Duplicate mapping keys, which YAML silently collapses, are reported too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from matrix.errors import UserError

JsonPath = tuple[Any, ...]


@dataclass
class Located:
    """Parsed YAML data plus the line of every node, keyed by its JSON path."""

    path: Path
    data: Any
    lines: dict[JsonPath, int] = field(default_factory=dict)

    def where(self, json_path: JsonPath | list[Any] = ()) -> str:
        """``file:line`` of the deepest node on ``json_path`` that the file actually has."""
        probe = tuple(json_path)
        while probe and probe not in self.lines:
            probe = probe[:-1]
        line = self.lines.get(probe)
        return f"{self.path}:{line}" if line else str(self.path)


def load(path: Path) -> Located:
    """Parse ``path``; any read or syntax problem becomes a one-line :class:`UserError`."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read: {exc}") from None
    return loads(text, path)


def loads(text: str, path: Path) -> Located:
    """Parse YAML ``text`` that came from ``path``."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark else ""
        problem = exc.problem or exc.context or "invalid YAML"
        raise UserError(f"{path}{line}: invalid YAML: {problem}") from None
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        raise UserError(f"{path}:{line}: invalid YAML: character {exc.character!r} "
                        "is not allowed") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: invalid YAML: {' '.join(str(exc).split())}") from None
    located = Located(path=path, data=None)
    if root is None:
        return located
    located.data = _construct(root, (), located)
    return located


def _construct(node: yaml.Node, json_path: JsonPath, located: Located) -> Any:
    located.lines[json_path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise UserError(f"{located.path}:{key_node.start_mark.line + 1}: "
                                "YAML merge keys (<<) are not supported")
            key = _scalar(key_node, located) if isinstance(key_node, yaml.ScalarNode) else None
            if not isinstance(key, (str, int, float, bool)):
                raise UserError(f"{located.path}:{key_node.start_mark.line + 1}: "
                                "mapping keys must be plain scalars")
            if key in result:
                raise UserError(f"{located.path}:{key_node.start_mark.line + 1}: "
                                f"duplicate key {key!r}")
            result[key] = _construct(value_node, json_path + (key,), located)
            # Point at the key's line: for a block value that is where a reader looks.
            located.lines[json_path + (key,)] = key_node.start_mark.line + 1
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_construct(item, json_path + (i,), located) for i, item in enumerate(node.value)]
    return _scalar(node, located)


def _scalar(node: yaml.Node, located: Located) -> Any:
    try:
        return yaml.SafeLoader(" ").construct_object(node, deep=True)
    except yaml.constructor.ConstructorError as exc:
        raise UserError(f"{located.path}:{node.start_mark.line + 1}: invalid YAML value: "
                        f"{exc.problem}") from None
