"""schemas.py - the 10 JSON Schemas the structured-output tests ask for
(response_format.py, schema_load.py): nested objects, arrays, enums, anyOf,
oneOf, $refs, formats, const, optional properties, each bounded
so that an answer ends by itself within a few hundred tokens."""
import jsonschema

S = {"type": "string", "maxLength": 8}
SCHEMAS = [
    {"type": "object", "properties": {"name": S, "n": {"type": "integer"},
                                      "ok": {"type": "boolean"}},
     "required": ["name", "n", "ok"], "additionalProperties": False},
    {"type": "object", "properties": {"user": {
        "type": "object", "properties": {"id": {"type": "integer"},
                                         "email": {"type": "string", "format": "email"}},
        "required": ["id", "email"]}}, "required": ["user"]},
    {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 4},
    {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 5}, {"type": "null"}]},
    {"$defs": {"point": {"type": "object", "properties": {
        "x": {"type": "integer"}, "y": {"type": "integer"}},
        "required": ["x", "y"], "additionalProperties": False}},
     "type": "object", "properties": {"from": {"$ref": "#/$defs/point"},
                                      "to": {"$ref": "#/$defs/point"}},
     "required": ["from", "to"], "additionalProperties": False},
    {"oneOf": [{"type": "object", "properties": {"kind": {"const": "circle"},
                                                 "r": {"type": "number"}},
                "required": ["kind", "r"], "additionalProperties": False},
               {"type": "object", "properties": {"kind": {"const": "square"},
                                                 "side": {"type": "integer"}},
                "required": ["kind", "side"], "additionalProperties": False}]},
    {"type": "object", "properties": {"when": {"type": "string", "format": "date-time"},
                                      "id": {"type": "string", "format": "uuid"},
                                      "day": {"type": "string", "format": "date"}},
     "required": ["when", "id", "day"], "additionalProperties": False},
    {"type": "object", "properties": {"version": {"const": 2},
                                      "level": {"enum": ["low", "mid", "high", None]}},
     "required": ["version", "level"]},
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string",
                                                                     "maxLength": 4},
                                      "c": {"type": "boolean"}},
     "required": ["b"], "additionalProperties": False},
    {"type": "array", "items": {"type": "object", "properties": {"x": {"type": "number"},
                                                                 "y": {"type": "number"}},
                                "required": ["x", "y"], "additionalProperties": False},
     "minItems": 2, "maxItems": 3},
]

# A recursive $ref: valid at any depth, so a model that keeps nesting runs
# into max_tokens (SmolLM2 does, a few times in 200); response_format.py
# asks for it on the small test model, schema_load.py does not.
RECURSIVE = {"$defs": {"node": {"type": "object", "properties": {
        "v": {"type": "integer"},
        "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 1}},
        "required": ["v"], "additionalProperties": False}}, "$ref": "#/$defs/node"}


def checker():
    """The formats jsonschema checks (the others are shapes it skips)."""
    return jsonschema.FormatChecker(formats=["uuid", "email"])
