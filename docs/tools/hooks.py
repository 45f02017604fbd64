"""MkDocs hooks of the Narad site.

1. Renders ../openapi.yaml into reference/http-api.md at build time (static Markdown, no
   JavaScript, nothing fetched), and publishes the spec itself as reference/openapi.yaml.
2. Keeps hand-written pages honest against the code they describe: the build warns (and
   so fails under --strict) when
   - guides/errors.md lacks a section for an ErrorCode of openapi.yaml,
   - operating/configuration.md lacks a flag of `narad serve` (broker/cmd/narad/config.go)
     or its NARAD_* variable,
   - operating/monitoring.md lacks a narad_* metric (broker/internal/broker/metrics.go,
     broker/internal/httpapi/listener.go, broker/internal/cluster/metrics.go).
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

import yaml
from mkdocs.structure.files import File, Files

log = logging.getLogger("mkdocs.plugins.narad")

_METHODS = ("get", "post", "put", "patch", "delete")
_API_PAGE = "reference/http-api.md"


def _repo_root(config: Any) -> str:
    return os.path.dirname(os.path.abspath(config["config_file_path"]))


def _load_spec(config: Any) -> tuple[dict[str, Any], str]:
    path = os.path.join(_repo_root(config), "openapi.yaml")
    with open(path, encoding="utf-8") as f:
        raw = f.read()
    return yaml.safe_load(raw), raw


# ---------------------------------------------------------------------------------------
# OpenAPI → Markdown


def _anchor(kind: str, name: str) -> str:
    return kind + "-" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def _blocks(text: str) -> str:
    """Spec text as Markdown: a list that follows a paragraph line needs a blank line
    before it in Python-Markdown (CommonMark does not ask for one)."""
    out: list[str] = []
    for line in text.strip().splitlines():
        if line.startswith("- ") and out and out[-1].strip() and not out[-1].startswith(("- ", " ")):
            out.append("")
        out.append(line)
    return "\n".join(out)


def _cell(text: str | None) -> str:
    """Text fit for one Markdown table cell."""
    if not text:
        return ""
    text = " ".join(line.strip() for line in str(text).strip().splitlines())
    return text.replace("|", "\\|")


class _Renderer:
    def __init__(self, spec: dict[str, Any]):
        self.spec = spec
        self.comp = spec.get("components", {})

    def ref(self, obj: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
        """Resolves a local $ref; returns (component name or None, the object)."""
        if isinstance(obj, dict) and "$ref" in obj:
            parts = obj["$ref"].lstrip("#/").split("/")
            node: Any = self.spec
            for p in parts:
                node = node[p]
            return parts[-1], node
        return None, obj

    def type_of(self, schema: dict[str, Any] | None) -> str:
        if not schema:
            return "any JSON value"
        name, s = self.ref(schema)
        if name:
            return f"[{name}](#{_anchor('schema', name)})"
        if "allOf" in s:
            return " and ".join(self.type_of(x) for x in s["allOf"])
        t = s.get("type")
        if t == "array":
            return "array of " + self.type_of(s.get("items"))
        if t is None:
            if s.get("x-go-type") == "json.RawMessage" or not s:
                return "any JSON value"
            return "object"
        out = t
        if s.get("format"):
            out += f" ({s['format']})"
        if s.get("nullable"):
            out += ", nullable"
        return out

    @staticmethod
    def constraints(s: dict[str, Any]) -> str:
        bits = []
        if "enum" in s:
            bits.append("one of " + ", ".join(f"`{v}`" for v in s["enum"]))
        for key, label in (("minimum", "≥"), ("maximum", "≤")):
            if key in s:
                bits.append(f"{label} {s[key]}")
        if "minLength" in s or "maxLength" in s:
            bits.append(f"length {s.get('minLength', 0)}–{s.get('maxLength', '∞')}")
        if "minItems" in s or "maxItems" in s:
            bits.append(f"{s.get('minItems', 0)}–{s.get('maxItems', '∞')} items")
        if "default" in s:
            bits.append(f"default `{s['default']}`")
        return "; ".join(bits)

    def describe(self, s: dict[str, Any]) -> str:
        _, s = self.ref(s)
        text = _cell(s.get("description"))
        c = self.constraints(s)
        if c:
            text = f"{text} ({c})" if text else c.capitalize() if not c.startswith("`") else c
        return text

    # -- operations ------------------------------------------------------------------

    def operations(self) -> list[tuple[str, str, dict[str, Any], list[dict[str, Any]]]]:
        ops = []
        for path, item in self.spec.get("paths", {}).items():
            shared = item.get("parameters", [])
            for m in _METHODS:
                if m in item:
                    ops.append((m.upper(), path, item[m], shared))
        return ops

    def params_table(self, params: list[dict[str, Any]]) -> list[str]:
        if not params:
            return []
        out = ["| parameter | in | type | required | description |", "|---|---|---|---|---|"]
        for p in params:
            _, p = self.ref(p)
            schema = p.get("schema", {})
            desc = _cell(p.get("description"))
            c = self.constraints(self.ref(schema)[1])
            if c:
                desc = f"{desc} ({c})" if desc else c
            out.append(
                f"| `{p['name']}` | {p['in']} | {self.type_of(schema)} | "
                f"{'yes' if p.get('required') else 'no'} | {desc} |"
            )
        return out + [""]

    def body(self, rb: dict[str, Any] | None) -> list[str]:
        if not rb:
            return []
        _, rb = self.ref(rb)
        out = ["**Request body**" + (" (required)" if rb.get("required") else "") + "", ""]
        if rb.get("description"):
            out += [rb["description"].strip(), ""]
        for ctype, media in rb.get("content", {}).items():
            schema = media.get("schema", {})
            if schema.get("format") == "binary":
                out.append(f"- `{ctype}`: the raw bytes of the message")
            else:
                out.append(f"- `{ctype}`: {self.type_of(schema)}")
        return out + [""]

    def responses(self, responses: dict[str, Any]) -> list[str]:
        out = ["**Responses**", "", "| status | meaning | body |", "|---|---|---|"]
        for status, r in responses.items():
            name, r = self.ref(r)
            meaning = _cell(r.get("description"))
            headers = r.get("headers", {})
            if headers:
                meaning += " Headers: " + ", ".join(f"`{h}`" for h in headers) + "."
            bodies = []
            for ctype, media in r.get("content", {}).items():
                bodies.append(f"{self.type_of(media.get('schema'))} (`{ctype}`)")
            out.append(f"| `{status}` | {meaning} | {'; '.join(bodies) or '—'} |")
        return out + [""]

    def operation(self, method: str, path: str, op: dict[str, Any], shared: list[dict[str, Any]]) -> list[str]:
        oid = op.get("operationId", f"{method} {path}")
        out = [f"### {op.get('summary', oid)} {{ #{_anchor('op', oid)} }}", ""]
        out += [f"`{method} {path}` · operation `{oid}`", ""]
        if op.get("security") == []:
            out += ["Needs no credentials, even with security on.", ""]
        if op.get("description"):
            out += [_blocks(op["description"]), ""]
        out += self.params_table(shared + op.get("parameters", []))
        out += self.body(op.get("requestBody"))
        out += self.responses(op.get("responses", {}))
        return out

    # -- schemas ---------------------------------------------------------------------

    def schema(self, name: str, s: dict[str, Any]) -> list[str]:
        out = [f"### {name} {{ #{_anchor('schema', name)} }}", ""]
        parts = s.get("allOf", [s])
        props: dict[str, Any] = {}
        required: set[str] = set()
        based_on = []
        for part in parts:
            ref_name, part = self.ref(part)
            if ref_name:
                based_on.append(f"[{ref_name}](#{_anchor('schema', ref_name)})")
            props.update(part.get("properties", {}))
            required.update(part.get("required", []))
        if s.get("description"):
            out += [_blocks(s["description"]), ""]
        if based_on:
            out += ["Every field of " + ", ".join(based_on) + ", plus the ones below.", ""]
        if "enum" in s and not props:
            out += ["Values: " + ", ".join(f"`{v}`" for v in s["enum"]), ""]
        if props:
            if s.get("additionalProperties") is False:
                out += ["Unknown fields are refused (400 `invalid_json`).", ""]
            out += ["| field | type | required | description |", "|---|---|---|---|"]
            for pname, p in props.items():
                if based_on and pname not in (parts[-1].get("properties") or {}):
                    continue
                out.append(
                    f"| `{pname}` | {self.type_of(p)} | {'yes' if pname in required else 'no'} | {self.describe(p)} |"
                )
            out.append("")
        elif s.get("type") and "enum" not in s:
            out += [f"Type: {self.type_of(s)}.", ""]
        return out

    def render(self) -> str:
        info = self.spec.get("info", {})
        tags = self.spec.get("tags", [])
        ops = self.operations()
        out = [
            "---",
            "title: HTTP API reference",
            "---",
            "",
            "# HTTP API reference",
            "",
            f"!!! info \"Generated from `openapi.yaml` (API version {info.get('version', '?')}) when this site was built\"",
            "    The spec is the one source of truth: the broker's server code and the Go SDK's",
            "    low-level client are generated from it, and every HTTP test validates the broker's",
            "    answers against it. Download it as [openapi.yaml](openapi.yaml) for your own tools.",
            "",
        ]
        desc = info.get("description", "").strip()
        if desc:
            out += [re.sub(r"^## ", "### ", _blocks(desc), flags=re.M), ""]
        out += ["## Operations", "", "| method | path | what | ", "|---|---|---|"]
        by_tag: dict[str, list] = {t["name"]: [] for t in tags}
        for method, path, op, shared in ops:
            tag = (op.get("tags") or ["other"])[0]
            by_tag.setdefault(tag, []).append((method, path, op, shared))
        for tag, items in by_tag.items():
            for method, path, op, _ in items:
                oid = op.get("operationId", "")
                out.append(f"| `{method}` | `{path}` | [{_cell(op.get('summary'))}](#{_anchor('op', oid)}) |")
        out.append("")

        schemes = self.comp.get("securitySchemes", {})
        if schemes:
            out += ["## Authentication", ""]
            for sname, sch in schemes.items():
                out += [f"`{sname}`: {sch.get('type')} {sch.get('scheme', '')}.", ""]
                if sch.get("description"):
                    out += [_blocks(sch["description"]), ""]

        tag_desc = {t["name"]: t.get("description", "") for t in tags}
        for tag, items in by_tag.items():
            if not items:
                continue
            out += [f"## {tag.capitalize()} {{ #{_anchor('tag', tag)} }}", ""]
            if tag_desc.get(tag):
                out += [tag_desc[tag], ""]
            for item in items:
                out += self.operation(*item)

        out += ["## Schemas", ""]
        for name, s in self.comp.get("schemas", {}).items():
            out += self.schema(name, s)
        return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------
# Hooks


def on_files(files: Files, config: Any) -> Files:
    spec, raw = _load_spec(config)
    files.append(File.generated(config, _API_PAGE, content=_Renderer(spec).render()))
    files.append(File.generated(config, "reference/openapi.yaml", content=raw))
    return files


def _flags(root: str) -> list[str]:
    with open(os.path.join(root, "broker", "cmd", "narad", "config.go"), encoding="utf-8") as f:
        src = f.read()
    names = re.findall(r'fs\.\w+Var\(&c\.\w+, "([a-z0-9-]+)"', src)
    names += re.findall(r'fs\.String\("([a-z0-9-]+)"', src)
    return sorted(set(names))


def _metrics(root: str) -> list[str]:
    names: set[str] = set()
    for rel in (("broker", "metrics.go"), ("broker", "collector.go"), ("httpapi", "listener.go"), ("cluster", "metrics.go")):
        with open(os.path.join(root, "broker", "internal", *rel), encoding="utf-8") as f:
            src = f.read()
        names.update(re.findall(r'Name:\s*"(narad_[a-z_]+)"', src))
        names.update(re.findall(r'NewDesc\(\s*"(narad_[a-z_]+)"', src))
    return sorted(names)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    src = page.file.src_uri
    root = _repo_root(config)
    missing: list[str] = []
    if src == "guides/errors.md":
        spec, _ = _load_spec(config)
        codes = spec["components"]["schemas"]["ErrorCode"]["enum"]
        missing = [c for c in codes if f"`{c}`" not in markdown]
        what = "error codes of openapi.yaml"
    elif src == "operating/configuration.md":
        flags = _flags(root)
        if not flags:
            missing = ["(no flags found in broker/cmd/narad/config.go: update tools/hooks.py)"]
        for fl in flags:
            env = "NARAD_" + fl.upper().replace("-", "_")
            if f"--{fl}" not in markdown:
                missing.append(f"--{fl}")
            if env not in markdown:
                missing.append(env)
        what = "flags of narad serve"
    elif src == "operating/monitoring.md":
        metrics = _metrics(root)
        if not metrics:
            missing = ["(no metrics found in broker/internal/broker/metrics.go: update tools/hooks.py)"]
        missing += [m for m in metrics if m not in markdown]
        what = "metrics of the broker"
    if missing:
        log.warning("%s does not describe these %s: %s", src, what, ", ".join(missing))
    return markdown
