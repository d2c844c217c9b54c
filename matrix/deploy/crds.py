"""The Kubeflow CRD schemas vendored in ``schemas/kubeflow/`` and a check of manifests against them.

No Kubernetes API server can run where this project is built and tested, so every manifest
``invoke k8s`` writes is checked here, offline, against the ``openAPIV3Schema`` of the served
version of its CRD (PyTorchJob v1 from kubeflow/training-operator, MPIJob v2beta1 from
kubeflow/mpi-operator, TrainJob v1alpha1 from kubeflow/trainer; sources, commits and licence in
``schemas/kubeflow/SOURCES.md``). ``jsonschema`` checks types, required fields, enums and patterns;
it ignores the ``x-kubernetes-*`` extensions and CEL rules, and no operator webhook runs here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from matrix.errors import UserError

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


def _loader() -> type:
    # the C loader reads the 600 KB files about ten times faster; PyYAML without libyaml still works
    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@cache
def schema(kind: str) -> dict[str, Any]:
    """The ``openAPIV3Schema`` of ``kind``'s served version, from its vendored CRD."""
    crd = CRDS[kind]
    with (SCHEMAS / crd.file).open(encoding="utf-8") as handle:
        document = yaml.load(handle, Loader=_loader())  # noqa: S506 - a safe loader
    group = document["spec"]["group"]
    for version in document["spec"]["versions"]:
        if f"{group}/{version['name']}" == crd.api_version and version.get("served"):
            return version["schema"]["openAPIV3Schema"]
    raise UserError(f"{crd.file}: no served version {crd.api_version}")


def errors(manifest: Mapping[str, Any]) -> list[str]:
    """Every place ``manifest`` breaks its CRD's schema, as ``path: message`` (sorted)."""
    kind = manifest.get("kind")
    if kind not in CRDS:
        return [f"kind: {kind!r} is not one of {', '.join(CRDS)}"]
    crd = CRDS[kind]
    if manifest.get("apiVersion") != crd.api_version:
        return [f"apiVersion: {manifest.get('apiVersion')!r} is not {crd.api_version}"]
    validator = jsonschema.Draft7Validator(schema(kind))
    found = []
    for error in validator.iter_errors(dict(manifest)):
        path = "/".join(str(part) for part in error.absolute_path) or "(top)"
        found.append(f"{path}: {error.message}")
    return sorted(found)


def validate(manifest: Mapping[str, Any]) -> None:
    """Raise one :class:`UserError` line when ``manifest`` breaks its CRD's schema."""
    found = errors(manifest)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise UserError(f"{manifest.get('kind')} fails its CRD schema: {found[0]}{more}")
