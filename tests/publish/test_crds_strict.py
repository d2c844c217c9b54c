"""Manifests are checked as ``kubectl apply --validate=strict`` checks them: a field the CRD's
structural schema does not define is an error, not a field the API server silently prunes."""

from __future__ import annotations

import copy

import pytest

from matrix.errors import UserError
from matrix.jobs import crds
from matrix.jobs.k8s import KINDS
from matrix.model.schema import jsonschema_library
from tests.helpers import written

IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/mnp/cuda@sha256:" + "b" * 64
UNKNOWN = "unknown field (not in the CRD schema"
PAIR = ("--stack", "cpu-tcp", "--nodes", "2", "--instance-type", "c5n.18xlarge", "--image-uri",
        IMAGE)


def _pod(manifest: dict) -> dict:
    """The first pod template's spec (TrainJob: the one in its runtime patch)."""
    spec = manifest["spec"]
    if manifest["kind"] == "TrainJob":
        job = spec["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
        return job["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    replicas = spec.get("pytorchReplicaSpecs") or spec["mpiReplicaSpecs"]
    return next(iter(replicas.values()))["template"]["spec"]


# (where, a misspelling users make): the root, the job's spec, a pod, its container, a volume
MISSPELLINGS = [
    (lambda m: m, "apiversion"),
    (lambda m: m["metadata"], "lables"),
    (lambda m: m["spec"], "runPolicyy"),
    (_pod, "nodeSelectr"),
    (lambda m: _pod(m)["containers"][0], "volumeMount"),
    (lambda m: _pod(m)["volumes"][0]["emptyDir"], "sizelimit"),
]


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize(("where", "field"), MISSPELLINGS, ids=[f for _, f in MISSPELLINGS])
def test_a_misspelt_field_is_refused_wherever_it_is(kind, where, field):
    manifest = written("k8s", "--kind", kind, *PAIR, command=["python3", "t.py"])
    assert crds.errors(manifest) == []
    where(manifest)[field] = {}
    found = crds.errors(manifest)  # one per pod template that shares the dict
    assert found and all(line.endswith(f"{field}: {UNKNOWN}: the API server would drop it, "
                                       "kubectl --validate=strict refuses it)")
                         for line in found), found
    with pytest.raises(UserError, match=f"fails its CRD schema: .*{field}: unknown field"):
        crds.validate(manifest)


def test_metadata_is_object_meta():
    manifest = written("k8s", "--kind", "mpijob", *PAIR, command=["true"])
    manifest["metadata"]["labels"]["team"] = 7
    manifest["metadata"]["annotations"] = {"owner": "ml"}
    assert crds.errors(manifest) == ["metadata/labels/team: 7 is not of type 'string'"]


def test_maps_and_preserved_objects_keep_their_unknown_keys():
    """``additionalProperties`` (a map such as ``nodeSelector`` or ``limits``) takes any key;
    ``x-kubernetes-preserve-unknown-fields`` keeps an object open; everything else is closed."""
    schema = {"type": "object", "properties": {
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "raw": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                "properties": {"known": {"type": "object", "properties": {"a": {}}}}},
        "items": {"type": "array", "items": {"type": "object", "properties": {"n": {}}}},
        "one": {"anyOf": [{"type": "integer"}, {"type": "string"}]}}}
    closed = copy.deepcopy(schema)
    crds._close(closed)
    check = jsonschema_library().Draft7Validator(closed)
    assert check.is_valid({"labels": {"any": "x"}, "raw": {"free": 1}, "one": 1})
    assert not check.is_valid({"raw": {"known": {"b": 1}}})  # closed below an open object
    assert not check.is_valid({"items": [{"n": 1, "m": 2}]})
    assert not check.is_valid({"extra": 1})


def test_the_vendored_schemas_are_left_as_vendored():
    for kind in crds.CRDS:
        assert crds.strict(kind) is not crds.schema(kind)
        assert "additionalProperties" not in crds.schema(kind)["properties"]["spec"]
