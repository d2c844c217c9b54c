"""Notices for the scheduler's user (issue 32): a line every artefact must carry to whoever
submits it (e.g. a stack's minimum NVIDIA driver). Each writer renders it in its own format, and
the artefact still passes its platform's schema."""

from __future__ import annotations

import yaml

from matrix.jobs import crds, jobdef, k8s, sbatch
from matrix.jobs.spec import NOTICE_ANNOTATION

IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/mnp/x@sha256:" + "e" * 64
NOTICE = "needs an NVIDIA driver >= 535.104.05 on every node"


def test_batch_carries_each_notice_as_a_tag():
    definition = jobdef.build_job_definition("cuda12.1-efa", 2, "p5.48xlarge", IMAGE,
                                             command=["t"], notices=[NOTICE])
    # botocore's model checked it; AWS tags take no ">" (spec.TAG_UNSAFE): said in words
    assert definition["tags"]["mnp:notice-1"] == NOTICE.replace(">=", "at least")


def test_the_slurm_script_states_each_notice_before_its_srun():
    script = sbatch.build_sbatch_script("cuda12.1-efa", 2, "p5.48xlarge", IMAGE, ["t"],
                                        notices=[NOTICE])
    assert f"# Notice: {NOTICE}" in script.split("\nsrun ")[0]


def test_every_kubeflow_kind_annotates_and_comments_each_notice():
    for kind in k8s.KINDS:
        manifest = k8s.build_manifest(kind, "cuda12.1-efa", 2, "p5.48xlarge", IMAGE, ["t"],
                                      notices=[NOTICE])
        assert crds.errors(manifest) == []
        assert manifest["metadata"]["annotations"][NOTICE_ANNOTATION] == NOTICE
        text = k8s.to_yaml(manifest)
        assert f"# Notice: {NOTICE}\n" in text.split("apiVersion")[0]
        assert yaml.safe_load(text)["metadata"]["annotations"][NOTICE_ANNOTATION] == NOTICE


def test_no_notice_leaves_the_artefacts_as_they_were():
    manifest = k8s.build_manifest("mpijob", "cpu-tcp", 2, "c5n.18xlarge", IMAGE, ["t"])
    assert "annotations" not in manifest["metadata"]
    assert "# Notice" not in sbatch.build_sbatch_script("cpu-tcp", 2, "c5n.18xlarge", IMAGE, ["t"])
