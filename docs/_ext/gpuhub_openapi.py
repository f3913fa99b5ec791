"""``{gpuhub-openapi} PATH``: an OpenAPI 3.0 file (the Credits API,
``hub_ext/credits/openapi.yaml``) rendered as tables: the API's description, then per
operation its parameters, request body and responses, then every schema with its fields.

sphinxcontrib-openapi 0.10 was tried first: its ``:request:`` output breaks docutils' field
lists (a warning, so the ``-W`` build fails) and without it no request body is shown.
"""

from __future__ import annotations

import yaml
from docutils import nodes
from docutils.parsers.rst import Directive
from gpuhub_nodes import inline, table

METHODS = ("get", "put", "post", "patch", "delete")


def resolve(spec: dict, obj: dict) -> dict:
    """``obj``, or what its ``$ref`` (``#/components/...``) points at."""
    while isinstance(obj, dict) and "$ref" in obj:
        node = spec
        for part in obj["$ref"].removeprefix("#/").split("/"):
            node = node[part]
        obj = {**node, **{k: v for k, v in obj.items() if k != "$ref"}}
    return obj


def ref_name(obj: dict) -> str | None:
    """The schema name of a ``$ref`` to ``#/components/schemas/NAME``, else None."""
    ref = obj.get("$ref", "") if isinstance(obj, dict) else ""
    return ref.rsplit("/", 1)[1] if ref.startswith("#/components/schemas/") else None


def schema_ref(name: str) -> nodes.Node:
    """A link to the schema's table on the same page."""
    ref = nodes.reference("", "", internal=True, refid=f"schema-{name.lower()}")
    ref += nodes.literal(text=name)
    return ref


def type_of(spec: dict, schema: dict) -> nodes.Node:
    """A schema's type as a cell: a link for a named schema, ``array of X``, or the type."""
    if name := ref_name(schema):
        return schema_ref(name)
    if schema.get("type") == "array":
        return inline("array of ", type_of(spec, schema.get("items", {})))
    kind = schema.get("type", "any")
    if schema.get("format"):
        kind += f" ({schema['format']})"
    return nodes.Text(kind)


def constraints(spec: dict, schema: dict) -> str:
    """Description and constraints of a schema, in words."""
    own = schema
    schema = resolve(spec, schema)
    words = [own.get("description") or ("" if ref_name(own) else schema.get("description", ""))]
    if schema.get("minLength") == 1 and not ref_name(own):
        words.append("not empty")
    for key, text in (
        ("minLength", "at least {} characters"),
        ("maxLength", "at most {} characters"),
        ("minimum", "at least {}"),
        ("maximum", "at most {}"),
        ("maxProperties", "at most {} entries"),
        ("default", "default {}"),
        ("pattern", "matches {}"),
        ("example", "e.g. {}"),
    ):
        if key in schema and not ref_name(own) and (key, schema[key]) != ("minLength", 1):
            words.append(text.format(schema[key]))
    if "enum" in schema:
        words.append("one of " + ", ".join(map(str, schema["enum"])))
    if schema.get("nullable"):
        words.append("may be null")
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict) and not ref_name(own):
        words.append(
            "values: "
            + extra.get("type", "any")
            + (f", at most {extra['maxLength']} characters" if "maxLength" in extra else "")
        )
    return "; ".join(w for w in words if w)


def fields_table(spec: dict, schema: dict) -> nodes.Node:
    """An object schema's fields: name, type, required, description and constraints."""
    schema = resolve(spec, schema)
    required = set(schema.get("required", []))
    rows = [
        [
            nodes.literal(text=name),
            type_of(spec, prop),
            "yes" if name in required else "no",
            constraints(spec, prop),
        ]
        for name, prop in schema.get("properties", {}).items()
    ]
    return table(["field", "type", "required", "meaning"], rows)


def operation(spec: dict, path: str, method: str, item: dict) -> list[nodes.Node]:
    """Heading, summary, parameters, request body and responses of one operation."""
    op = item[method]
    out: list[nodes.Node] = []
    title = nodes.rubric(classes=["gpuhub-operation"])
    title += nodes.literal(text=f"{method.upper()} {path}")
    out += [title, nodes.paragraph(text=op.get("summary", ""))]
    params = [resolve(spec, p) for p in item.get("parameters", []) + op.get("parameters", [])]
    if params:
        out.append(
            table(
                ["parameter", "in", "required", "type", "meaning"],
                [
                    [
                        nodes.literal(text=p["name"]),
                        p["in"],
                        "yes" if p.get("required") else "no",
                        type_of(spec, p.get("schema", {})),
                        "; ".join(
                            w
                            for w in (
                                p.get("description", ""),
                                constraints(spec, p.get("schema", {})),
                            )
                            if w
                        ),
                    ]
                    for p in params
                ],
            )
        )
    body = op.get("requestBody")
    if body:
        schema = body["content"]["application/json"]["schema"]
        para = nodes.paragraph()
        para += inline(
            "Request body (JSON",
            ", required" if body.get("required") else "",
            "): ",
            type_of(spec, schema),
        )
        out.append(para)
    rows, inline_schemas = [], []
    for status, response in op.get("responses", {}).items():
        response = resolve(spec, response)
        schema = response.get("content", {}).get("application/json", {}).get("schema")
        if schema and not ref_name(schema) and schema.get("properties"):
            inline_schemas.append((status, schema))
            body_cell = nodes.Text("object, below")
        else:
            body_cell = type_of(spec, schema) if schema else nodes.Text("-")
        rows.append([status, response.get("description", ""), body_cell])
    out.append(table(["status", "meaning", "body (JSON)"], rows))
    for status, schema in inline_schemas:
        out += [nodes.paragraph(text=f"The {status} answer's fields:"), fields_table(spec, schema)]
    return out


class OpenAPIDirective(Directive):
    """Render the OpenAPI file named in the argument (relative to the page)."""

    required_arguments = 1
    has_content = False

    def run(self):
        env = self.state.document.settings.env
        rel, path = env.relfn2path(self.arguments[0], env.docname)
        env.note_dependency(rel)
        spec = yaml.safe_load(open(path, encoding="utf-8"))
        info = spec.get("info", {})
        out: list[nodes.Node] = [
            nodes.paragraph(text=f"{info.get('title', '')}, version {info.get('version', '?')}.")
        ]
        for text in info.get("description", "").strip().split("\n\n"):
            out.append(nodes.paragraph(text=" ".join(text.split())))
        servers = [s["url"] for s in spec.get("servers", [])]
        schemes = spec.get("components", {}).get("securitySchemes", {})
        auth = ", ".join(
            f"{s.get('scheme', s.get('type'))} token ({name})" for name, s in schemes.items()
        )
        para = nodes.paragraph()
        para += inline(
            "Authentication: ",
            auth or "none",
            ". Example server: ",
            *(nodes.literal(text=u) for u in servers[:1]),
            ".",
        )
        out.append(para)
        out.append(nodes.rubric(text="Operations"))
        for path_, item in spec.get("paths", {}).items():
            for method in METHODS:
                if method in item:
                    out += operation(spec, path_, method, item)
        out.append(nodes.rubric(text="Schemas"))
        for name, schema in spec.get("components", {}).get("schemas", {}).items():
            target = nodes.target("", "", ids=[f"schema-{name.lower()}"])
            title = nodes.rubric()
            title += nodes.literal(text=name)
            out += [target, title]
            if schema.get("type") == "object":
                out.append(fields_table(spec, schema))
            else:
                out.append(
                    nodes.paragraph(
                        text=f"{schema.get('type', 'any')}: {constraints(spec, schema)}"
                    )
                )
        return out


def setup(app):
    app.add_directive("gpuhub-openapi", OpenAPIDirective)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
