"""YAML mappings that name a key twice are refused, each repeat with both of its lines.

Why: PyYAML (as YAML 1.1 allows) keeps the LAST value of a repeated key without a word, so a config
with a second `train:` block silently lost the whole first one (its learning rate, its steps, its
checkpoint cadence) and the run trained with defaults the user never chose. Every YAML framer_ds reads
from a user (training configs, the accelerate YAML checks) goes through `UniqueKeyLoader`.

Merge keys (`<<: *defaults`) are not repeats: a key beside a merge overrides the merged one on purpose.
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from framer_ds.config.errors import ConfigProblem

_MERGE_TAG = "tag:yaml.org,2002:merge"


@dataclass(frozen=True)
class RepeatedKey:
    """`key` (a dotted path from the document's top) set on `first_line` and again on `line` (1-based)."""

    key: str
    first_line: int
    line: int

    def describe(self) -> str:
        return (
            f"set twice, on lines {self.first_line} and {self.line}: YAML would silently keep only the "
            f"second (a repeated section replaces the whole first one); merge them into one"
        )


class RepeatedKeysError(yaml.YAMLError):
    """A document names some key twice in one mapping; `repeats` lists every such key."""

    def __init__(self, repeats: list[RepeatedKey]):
        self.repeats = repeats
        super().__init__("; ".join(f"{r.key}: {r.describe()}" for r in repeats))

    def problems(self, source: str) -> list[ConfigProblem]:
        """One problem per repeated key, located as `SOURCE: key`."""
        return [ConfigProblem(f"{source}: {r.key}", r.describe()) for r in self.repeats]


class UniqueKeyLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that raises RepeatedKeysError, listing every repeat in the document at once,
    before it builds any value."""

    def construct_document(self, node: Node):
        repeats = repeated_keys(self, node)
        if repeats:
            raise RepeatedKeysError(repeats)
        return super().construct_document(node)


def repeated_keys(loader: yaml.SafeLoader, root: Node) -> list[RepeatedKey]:
    """Every key named twice in one mapping of the composed document `root`, by the line of the repeat."""
    found: list[RepeatedKey] = []
    seen_nodes: set[int] = set()  # an alias points at a node already walked

    def walk(node: Node, path: str) -> None:
        if id(node) in seen_nodes:
            return
        seen_nodes.add(id(node))
        if isinstance(node, SequenceNode):
            for index, item in enumerate(node.value):
                walk(item, f"{path}[{index}]")
        elif isinstance(node, MappingNode):
            first: dict[object, int] = {}
            for key_node, value_node in node.value:
                if key_node.tag == _MERGE_TAG or not isinstance(key_node, ScalarNode):
                    continue
                key = _scalar_key(loader, key_node)
                dotted = f"{path}.{key}" if path else str(key)
                line = key_node.start_mark.line + 1
                if key in first:
                    found.append(RepeatedKey(dotted, first[key], line))
                else:
                    first[key] = line
                walk(value_node, dotted)

    walk(root, "")
    return sorted(found, key=lambda repeat: repeat.line)


def _scalar_key(loader: yaml.SafeLoader, node: ScalarNode) -> object:
    """The key as the mapping would hold it (`true` and `True` are one key), or its text when it cannot
    be hashed or built."""
    try:
        value = loader.construct_object(node)
        hash(value)
        return value
    except (yaml.YAMLError, TypeError, ValueError):
        return node.value
