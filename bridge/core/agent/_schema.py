"""The JSON Schemas a game hands the bridge (tool parameters, structured answers): checked
once when they arrive (``check_schema``), then applied to what the model produced.

A schema that passes ``check_schema`` can be validated against without the validator
recursing for ever or fetching anything: every ``$ref`` is local and resolves, and no chain
of same-instance keywords refers back to itself.
"""

from __future__ import annotations

from typing import Any

import jsonschema
import referencing
import referencing.exceptions
import referencing.jsonschema

from bridge.errors import BridgeError

# Keywords whose values are data, not schemas: a "$ref" inside them is not a reference.
_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples", "example"})
# Keywords whose values map names (not keywords) to schemas.
_NAMED_SCHEMAS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
# Keywords whose subschemas apply to the same instance: a cycle through these (and "$ref")
# never consumes the instance, so validating it would recurse forever.
_SAME_INSTANCE_LISTS = ("allOf", "anyOf", "oneOf")
_SAME_INSTANCE_ONE = ("not", "if", "then", "else")
_REF_KEYWORDS = ("$ref", "$dynamicRef", "$recursiveRef")


def _validator_class(schema: dict[str, Any], what: str) -> Any:
    meta = schema.get("$schema")
    if meta is None:
        return jsonschema.Draft202012Validator
    if not isinstance(meta, str):
        raise BridgeError(
            "invalid_schema", f"{what}: $schema must be a string naming a JSON Schema draft", path=["$schema"]
        )
    cls = jsonschema.validators.validator_for(schema, default=None)  # type: ignore[arg-type]
    if cls is None:
        raise BridgeError("invalid_schema", f"{what}: unsupported $schema {meta[:200]!r}", path=["$schema"])
    return cls


def check_schema(schema: Any, what: str, *, tool: bool = False) -> None:
    """Raise ``invalid_schema`` unless ``schema`` is a JSON Schema the bridge can use.

    Checked: an object; ``$schema`` (if given) names a known draft; the schema is valid
    against its metaschema; every ``$ref`` is local (starts with ``#``) and resolves; no chain
    of ``$ref``/``allOf``/``anyOf``/``oneOf``/``not``/``if`` refers back to itself without
    consuming the instance. With ``tool=True`` the top level must be ``"type": "object"``
    (tool arguments are an object on the wire). Never raises anything else."""
    if not isinstance(schema, dict):
        raise BridgeError("invalid_schema", f"{what} must be a JSON Schema object")
    try:
        cls = _validator_class(schema, what)
        cls.check_schema(schema)
    except BridgeError:
        raise
    except jsonschema.SchemaError as e:
        raise BridgeError("invalid_schema", f"{what}: {e.message}", path=list(e.path)) from None
    except RecursionError:
        raise BridgeError("invalid_schema", f"{what}: nested too deeply") from None
    except Exception as e:  # a schema that breaks the checker itself is still the peer's
        raise BridgeError("invalid_schema", f"{what}: not a usable JSON Schema ({type(e).__name__})") from None
    try:
        _RefChecker(schema, cls, what).check()
    except BridgeError:
        raise
    except RecursionError:
        raise BridgeError("invalid_schema", f"{what}: nested too deeply") from None
    except Exception as e:
        raise BridgeError("invalid_schema", f"{what}: references cannot be resolved ({type(e).__name__})") from None
    if tool and schema.get("type") != "object":
        raise BridgeError("invalid_schema", f'{what} must be an object schema ("type": "object")', path=["type"])


class _RefChecker:
    """Walks every subschema of one root once: references must be local and resolve, and no
    same-instance chain may come back to a schema it is still inside (``on_stack``)."""

    def __init__(self, root: dict[str, Any], cls: Any, what: str) -> None:
        self.root = root
        self.what = what
        dialect = cls.META_SCHEMA.get("$id") or cls.META_SCHEMA.get("id") or ""
        self.spec = referencing.jsonschema.specification_with(
            dialect.rstrip("#"), default=referencing.jsonschema.DRAFT202012
        )
        resource = self.spec.create_resource(root)
        registry: referencing.Registry[Any] = (
            referencing.Registry().with_resource(resource.id() or "", resource).crawl()
        )
        self.resolver = registry.resolver(base_uri=resource.id() or "")
        self.on_stack: set[int] = set()  # the current same-instance chain
        self.done: set[int] = set()

    def check(self) -> None:
        self.visit(self.root, self.resolver)

    def resolve(self, node: dict[str, Any], res: Any, key: str) -> tuple[Any, Any] | None:
        ref = node.get(key)
        if not isinstance(ref, str):
            return None
        if not ref.startswith("#"):
            raise BridgeError(
                "invalid_schema",
                f"{self.what}: {key} {ref[:200]!r} is not local (only '#...' references are allowed)",
            )
        if key != "$ref":
            return None  # dynamic references resolve at validation time; local is enough
        try:
            found = res.lookup(ref)
        except referencing.exceptions.Unresolvable:
            raise BridgeError("invalid_schema", f"{self.what}: $ref {ref[:200]!r} does not resolve") from None
        return found.contents, found.resolver

    def visit(self, node: Any, res: Any) -> None:
        if not isinstance(node, dict):
            if isinstance(node, list):
                for x in node:
                    self.visit(x, res)
            return
        if isinstance(node.get("$id"), str) or isinstance(node.get("id"), str):
            res = res.in_subresource(self.spec.create_resource(node))
        key = id(node)
        if key in self.on_stack:
            raise BridgeError(
                "invalid_schema", f"{self.what}: a reference refers back to itself without consuming the instance"
            )
        if key in self.done:
            return
        self.on_stack.add(key)
        try:
            self._visit_same_instance(node, res)
        finally:
            self.on_stack.discard(key)
        self.done.add(key)
        self._visit_consuming(node, res)

    def _visit_same_instance(self, node: dict[str, Any], res: Any) -> None:
        for k in _REF_KEYWORDS:
            target = self.resolve(node, res, k)
            if target is not None:
                self.visit(target[0], target[1])
        for k in _SAME_INSTANCE_LISTS:
            if isinstance(node.get(k), list):
                for x in node[k]:
                    self.visit(x, res)
        for k in _SAME_INSTANCE_ONE:
            self.visit(node.get(k), res)
        if isinstance(node.get("dependentSchemas"), dict):
            for x in node["dependentSchemas"].values():
                self.visit(x, res)

    def _visit_consuming(self, node: dict[str, Any], res: Any) -> None:
        """Subschemas that consume the instance (properties, items, ...): a fresh chain each."""
        saved = set(self.on_stack)
        self.on_stack.clear()
        try:
            for k, v in node.items():
                if k in _DATA_KEYWORDS or k in _SAME_INSTANCE_LISTS or k in _SAME_INSTANCE_ONE:
                    continue
                if k == "dependentSchemas":
                    continue
                if k in _NAMED_SCHEMAS and isinstance(v, dict):
                    for x in v.values():
                        self.visit(x, res)
                elif isinstance(v, (dict, list)):
                    self.visit(v, res)
        finally:
            self.on_stack.clear()
            self.on_stack.update(saved)


def make_validator(schema: dict[str, Any]) -> Any:
    """A validator for a schema ``check_schema`` accepted, with format checking (email,
    date, ...: the formats jsonschema can check with what is installed)."""
    cls = _validator_class(schema, "schema")
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def first_error(validator: Any, value: Any) -> str | None:
    """The message of the most relevant error of ``value`` (jsonschema's ``best_match``)."""
    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    return None if error is None else str(error.message)


def reorder_to_schema(value: Any, schema: dict[str, Any] | None) -> Any:
    """Return ``value`` with object keys in the schema's property order (extras last)."""
    if not isinstance(schema, dict):
        return value
    if isinstance(value, dict):
        props = schema.get("properties")
        if not isinstance(props, dict):
            props = {}
        out = {k: reorder_to_schema(value[k], props[k]) for k in props if k in value}
        out.update((k, v) for k, v in value.items() if k not in out)
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [reorder_to_schema(v, schema["items"]) for v in value]
    return value
