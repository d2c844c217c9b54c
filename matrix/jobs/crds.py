"""The Kubeflow CRD schemas vendored in ``schemas/kubeflow/`` and a check of manifests against them.

No Kubernetes API server can run where this project is built and tested, so every manifest
``invoke k8s`` writes is checked here, offline, against the ``openAPIV3Schema`` of the served
version of its CRD (PyTorchJob v1 from kubeflow/training-operator, MPIJob v2beta1 from
kubeflow/mpi-operator, TrainJob v1alpha1 from kubeflow/trainer; sources, commits and licence in
``schemas/kubeflow/SOURCES.md``). ``jsonschema`` checks types, required fields, enums and patterns;
it ignores CEL rules (``x-kubernetes-validations``), and no operator webhook runs here.

Unknown fields are errors, as ``kubectl apply --validate=strict`` makes them. A CRD's schema is
structural, and the API server prunes every field it does not define: a field is known only where
its object lists it under ``properties`` (or gives ``additionalProperties``, a map), unless the
object sets ``x-kubernetes-preserve-unknown-fields: true``; the root ``metadata`` is ObjectMeta,
whatever the CRD says (https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/
custom-resource-definitions/, "Field pruning" and "Specifying a structural schema"; strict field
validation reports what pruning would drop: https://kubernetes.io/docs/reference/using-api/
api-concepts/#field-validation). :func:`strict` writes that rule into the schema as
``additionalProperties: false``, so a misspelt field fails here instead of vanishing on apply.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from matrix.errors import UserError
from matrix.model import yamlsrc
from matrix.model.schema import jsonschema_library
from matrix.model.settings import cached_json, remember_text

if TYPE_CHECKING:
    import jsonschema

SCHEMAS = Path(__file__).parent / "schemas" / "kubeflow"


@dataclass(frozen=True)
class Crd:
    """Where one kind's CRD is vendored and which ``apiVersion`` manifests of it carry."""

    kind: str
    api_version: str
    file: str


CRDS = {
    "PyTorchJob": Crd("PyTorchJob", "kubeflow.org/v1", "kubeflow.org_pytorchjobs.yaml"),
    "MPIJob": Crd("MPIJob", "kubeflow.org/v2beta1", "kubeflow.org_mpijobs.yaml"),
    "TrainJob": Crd("TrainJob", "trainer.kubeflow.org/v1alpha1",
                    "trainer.kubeflow.org_trainjobs.yaml"),
}


# The user's cache folder (matrix/model/settings.py) of the served schemas as JSON: parsing a
# vendored CRD's YAML (450 to 670 kB) took 0.1 s of every command that writes or explains a
# Kubeflow job; reading the JSON takes 3 ms. Each file is named by the sha256 of the CRD file and
# the apiVersion, so an updated CRD is read from its YAML again.
CACHE = "crd-schemas"


@cache
def schema(kind: str) -> dict[str, Any]:
    """The ``openAPIV3Schema`` of ``kind``'s served version, from its vendored CRD (through
    ``CACHE``: a cache that cannot be read or written only means parsing the YAML)."""
    crd = CRDS[kind]
    raw = (SCHEMAS / crd.file).read_bytes()
    key = f"{hashlib.sha256(raw).hexdigest()}-{crd.api_version.replace('/', '-')}.json"
    cached = cached_json(CACHE, key)
    if isinstance(cached, dict):
        return cached
    document = yamlsrc.load_shipped(raw.decode("utf-8"))
    group = document["spec"]["group"]
    for version in document["spec"]["versions"]:
        if f"{group}/{version['name']}" == crd.api_version and version.get("served"):
            found = version["schema"]["openAPIV3Schema"]
            with contextlib.suppress(TypeError, ValueError):  # a YAML value JSON cannot hold
                remember_text(CACHE, key, json.dumps(found, separators=(",", ":")))
            return found
    raise UserError(f"{crd.file}: no served version {crd.api_version}")


# ObjectMeta's fields (https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/
# object-meta/): the API server checks the root metadata of every object against these.
OBJECT_META = ("annotations", "creationTimestamp", "deletionGracePeriodSeconds",
               "deletionTimestamp", "finalizers", "generateName", "generation", "labels",
               "managedFields", "name", "namespace", "ownerReferences", "resourceVersion",
               "selfLink", "uid")
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_PRESERVE = "x-kubernetes-preserve-unknown-fields"


def _close(node: dict[str, Any]) -> None:
    """Make ``node`` and every object below it refuse the fields its schema does not define.

    ``allOf``/``anyOf``/``oneOf``/``not`` are left alone: in a structural schema they only
    restrict values and never make a field known."""
    if not node.get(_PRESERVE) and "additionalProperties" not in node and (
            node.get("type") == "object" or "properties" in node):
        node["additionalProperties"] = False
    for child in node.get("properties", {}).values():
        _close(child)
    if isinstance(node.get("additionalProperties"), dict):
        _close(node["additionalProperties"])
    if isinstance(node.get("items"), dict):
        _close(node["items"])


@cache
def strict(kind: str) -> dict[str, Any]:
    """``kind``'s schema as the API server applies it: unknown fields refused, root
    ``metadata`` checked as ObjectMeta (names and label and annotation maps)."""
    closed = copy.deepcopy(schema(kind))
    closed["properties"]["metadata"] = {
        "type": "object", "properties": {name: {} for name in OBJECT_META}}
    closed["properties"]["metadata"]["properties"].update(labels=_STRING_MAP,
                                                          annotations=_STRING_MAP)
    _close(closed)
    return closed


def _message(error: jsonschema.ValidationError) -> list[str]:
    """One ``path: message`` per problem; an unknown field named at its own path."""
    path = "/".join(str(part) for part in error.absolute_path)
    if error.validator == "additionalProperties" and error.validator_value is False:
        known = set(error.schema.get("properties", {}))
        return [f"{path + '/' if path else ''}{field}: unknown field (not in the CRD schema: "
                "the API server would drop it, kubectl --validate=strict refuses it)"
                for field in sorted(set(error.instance) - known)]
    return [f"{path or '(top)'}: {error.message}"]


def errors(manifest: Mapping[str, Any]) -> list[str]:
    """Every place ``manifest`` breaks its CRD's schema, as ``path: message`` (sorted)."""
    kind = manifest.get("kind")
    if kind not in CRDS:
        return [f"kind: {kind!r} is not one of {', '.join(CRDS)}"]
    crd = CRDS[kind]
    if manifest.get("apiVersion") != crd.api_version:
        return [f"apiVersion: {manifest.get('apiVersion')!r} is not {crd.api_version}"]
    validator = jsonschema_library().Draft7Validator(strict(kind))
    return sorted(line for error in validator.iter_errors(dict(manifest))
                  for line in _message(error))


def validate(manifest: Mapping[str, Any]) -> None:
    """Raise one :class:`UserError` line when ``manifest`` breaks its CRD's schema."""
    found = errors(manifest)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise UserError(f"{manifest.get('kind')} fails its CRD schema: {found[0]}{more}")
