"""How jsonschema is imported (matrix/model/schema.py, ``jsonschema_library``): without the
optional format modules (rfc3987-syntax's grammars alone cost every command about 2 s), which is
safe only while no validator run in-process checks formats; the bill of materials, whose schema
does, keeps them (matrix/image/sbom.py, ``schema_error``)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

from matrix.image import sbom
from matrix.model.loader import load_matrix
from matrix.model.schema import FORMAT_MODULES
from matrix.model.settings import ROOT

SBOM_MODULE = ROOT / "matrix" / "image" / "sbom.py"  # checks formats in a process of its own


def format_checking(path) -> list[str]:
    """Where ``path`` names a format checker (``format_checker=`` or ``FormatChecker``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.keyword) and node.arg == "format_checker":
            found.append(f"{path.name}:{node.value.lineno} format_checker=")
        elif isinstance(node, (ast.Name, ast.Attribute)) and \
                getattr(node, "id", getattr(node, "attr", "")).endswith("FormatChecker"):
            found.append(f"{path.name}:{node.lineno} FormatChecker")
    return found


def test_no_validator_run_in_process_checks_formats():
    """With a format checker, the hidden modules' formats would pass unchecked."""
    modules = [path for path in (ROOT / "matrix").rglob("*.py") if path != SBOM_MODULE]
    assert len(modules) > 40
    assert [where for path in modules for where in format_checking(path)] == []


def test_the_check_can_see_a_format_checker(tmp_path):
    """The check above is not blind to either spelling."""
    module = tmp_path / "checks.py"
    module.write_text("import jsonschema\n"
                      "v = jsonschema.Draft7Validator({}, format_checker=None)\n"
                      "c = jsonschema.FormatChecker()\n")
    assert format_checking(module) == ["checks.py:2 format_checker=", "checks.py:3 FormatChecker"]


def jsonschema_format_modules() -> list[str]:
    """The optional modules jsonschema's format module imports, read from its source."""
    import importlib.util

    origin = importlib.util.find_spec("jsonschema._format").origin
    tree = ast.parse(Path(origin).read_text(encoding="utf-8"))
    names = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
             for alias in node.names}
    names |= {node.module.split(".")[0] for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.module and not node.level}
    return sorted(name for name in names if name not in sys.stdlib_module_names | {"jsonschema"})


def test_every_format_module_of_jsonschema_is_hidden():
    assert "isoduration" in jsonschema_format_modules()  # the reading works
    assert set(jsonschema_format_modules()) <= set(FORMAT_MODULES)


def test_loading_the_matrix_imports_no_format_module(tmp_path):
    # none of them may be loaded by a command, and each can still be imported after; an empty
    # cache folder, so that the matrix is checked, not found passed before
    code = ("import sys; from pathlib import Path; from matrix.model.loader import load_matrix; "
            "from matrix.jobs import crds; load_matrix(Path(sys.argv[1])); "
            "crds.errors({'kind': 'MPIJob', 'apiVersion': crds.CRDS['MPIJob'].api_version}); "
            "print(sorted(m for m in ('jsonschema', 'lark', *sys.argv[2:]) if m in sys.modules)); "
            "import importlib.util; installed = [m for m in sys.argv[2:] if "
            "importlib.util.find_spec(m)]; [importlib.import_module(m) for m in installed]; "
            "print(len(installed))")
    proc = subprocess.run([sys.executable, "-c", code, str(ROOT / "stacks.yaml"),
                           *jsonschema_format_modules()], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded, installed = proc.stdout.split()
    assert loaded == "['jsonschema']"
    assert int(installed) >= 5  # the json-validation extra's: the check hid something


def test_no_module_imports_jsonschema_itself():
    """Only ``jsonschema_library()`` imports it, without the format modules: a test module that
    imported it at its top once cost every collection of the suite (about 16 a run) 2.5 s of
    CPU, rfc3987_syntax compiling its 38 grammars."""
    candidates = [path for folder in ("matrix", "tests", "bench", "entrypoint")
                  for path in (ROOT / folder).rglob("*.py")
                  if "jsonschema" in path.read_text(encoding="utf-8")]  # parse only these
    importing = sorted(
        str(path.relative_to(ROOT)) for path in candidates
        if any(isinstance(node, ast.Import) and any(a.name.split(".")[0] == "jsonschema"
                                                    for a in node.names)
               or isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0]
               == "jsonschema"
               for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))))
    assert importing == ["matrix/jobs/crds.py", "matrix/model/schema.py"], importing


def test_the_bill_of_materials_is_checked_for_iri_formats():
    matrix = load_matrix(ROOT / "stacks.yaml")
    stack = matrix.stack("cuda10.1-tcp")  # components built from source carry a URL
    text = sbom.document(matrix, stack, "mnp-stacks:cuda10.1-tcp", "sha256:" + "0" * 64, [], [])
    assert sbom.schema_error(text) == ""
    document = json.loads(text)
    built = next(c for c in document["components"] if c.get("externalReferences"))
    built["externalReferences"][0]["url"] = "https://example.org/a b"  # not an IRI reference
    assert "iri-reference" in sbom.schema_error(json.dumps(document))
