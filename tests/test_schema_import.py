"""How jsonschema is imported (matrix/model/schema.py, ``jsonschema_library``): without the
rfc3987-syntax grammars that cost every command about 2 s, which is safe only while no schema
checked in-process uses the formats they check; the bill of materials, whose schema does, keeps
them (matrix/image/sbom.py, ``schema_error``)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import yaml

from matrix.image import sbom
from matrix.model.loader import load_matrix
from matrix.model.schema import IRI_FORMATS, SLOW_FORMAT_MODULE
from matrix.model.settings import ROOT

# Every schema the matrix checks in its own process: its files' schemas, each component's
# options, the vendored Kubeflow CRDs.
IN_PROCESS_SCHEMAS = [*sorted((ROOT / "matrix" / "model" / "schemas").glob("*.yaml")),
                      *sorted((ROOT / "images").glob("*/options.schema.yaml")),
                      *sorted((ROOT / "matrix" / "jobs" / "schemas").rglob("*.yaml"))]


def formats(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        if isinstance(node.get("format"), str):
            yield node["format"]
        for value in node.values():
            yield from formats(value)
    elif isinstance(node, list):
        for value in node:
            yield from formats(value)


def test_no_schema_checked_in_process_uses_an_iri_format():
    assert len(IN_PROCESS_SCHEMAS) > 20
    used = {str(path.relative_to(ROOT)): sorted(set(formats(yaml.safe_load(path.read_text())))
                                                & set(IRI_FORMATS))
            for path in IN_PROCESS_SCHEMAS}
    assert {path: found for path, found in used.items() if found} == {}


def test_loading_the_matrix_does_not_compile_the_iri_grammars():
    # rfc3987-syntax builds its parsers with lark: neither may be loaded, and both still can be
    code = ("import sys; from pathlib import Path; from matrix.model.loader import load_matrix; "
            "from matrix.jobs import crds; load_matrix(Path(sys.argv[1])); "
            "print(sorted(m for m in ('jsonschema', 'lark', sys.argv[2]) if m in sys.modules)); "
            "import rfc3987_syntax")
    proc = subprocess.run([sys.executable, "-c", code, str(ROOT / "stacks.yaml"),
                           SLOW_FORMAT_MODULE], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["['jsonschema']"]


def test_the_bill_of_materials_is_checked_for_iri_formats():
    matrix = load_matrix(ROOT / "stacks.yaml")
    stack = matrix.stack("cuda10.1-tcp")  # components built from source carry a URL
    text = sbom.document(matrix, stack, "mnp-stacks:cuda10.1-tcp", "sha256:" + "0" * 64, [], [])
    assert sbom.schema_error(text) == ""
    document = json.loads(text)
    built = next(c for c in document["components"] if c.get("externalReferences"))
    built["externalReferences"][0]["url"] = "https://example.org/a b"  # not an IRI reference
    assert "iri-reference" in sbom.schema_error(json.dumps(document))
