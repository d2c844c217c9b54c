"""Notices for the scheduler's user (issue 32): a line every artefact must carry to whoever
submits it (e.g. a stack's minimum NVIDIA driver). Each writer renders it in its own format, and
the artefact still passes its platform's schema.

The artefacts are what each task writes (tests.helpers.written) for cuda10.1-tcp on p3.16xlarge,
whose job has two notices: the stack's driver floor and the instance row's own.
"""

from __future__ import annotations

import yaml

from matrix.jobs import crds, k8s
from matrix.jobs.spec import NOTICE_ANNOTATION
from tests.helpers import written

IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/mnp/x@sha256:" + "e" * 64
PAIR = ("--stack", "cuda10.1-tcp", "--nodes", "2", "--instance-type", "p3.16xlarge",
        "--image-uri", IMAGE)
PLAIN = ("--stack", "cpu-tcp", "--nodes", "2", "--instance-type", "c5n.18xlarge",
         "--image-uri", IMAGE)
DRIVER = "NVIDIA driver >= 418.39 for CUDA 10.1.243"
OFFERED = "p3.16xlarge is gone from Karpenter's instance-type reference"
COMMAND = ["python3", "train.py"]


def test_batch_carries_each_notice_as_a_tag():
    definition = written("jobdef", *PAIR, command=COMMAND)
    # botocore's model checked it; AWS tags take no ">" or "'" (spec.TAG_UNSAFE): said in words,
    # each within Batch's 256 characters
    tags = {key: value for key, value in definition["tags"].items() if "notice" in key}
    assert list(tags) == ["mnp:notice-1", "mnp:notice-2"]
    assert tags["mnp:notice-1"].startswith(DRIVER.replace(">=", "at least"))
    assert tags["mnp:notice-2"].startswith(OFFERED.replace("'", " "))
    assert all(len(value) <= 256 for value in tags.values())


def test_the_slurm_script_states_each_notice_before_its_srun():
    head = written("sbatch", *PAIR, command=COMMAND).split("\nsrun ")[0]
    notes = [line for line in head.splitlines() if line.startswith("# Notice: ")]
    assert len(notes) == 2, head
    assert notes[0].startswith(f"# Notice: {DRIVER}") and notes[1].startswith(
        f"# Notice: {OFFERED}")


def test_every_kubeflow_kind_annotates_and_comments_each_notice():
    for kind in k8s.KINDS:
        manifest = written("k8s", "--kind", kind, *PAIR, command=COMMAND)
        assert crds.errors(manifest) == []
        notices = manifest["metadata"]["annotations"][NOTICE_ANNOTATION].splitlines()
        assert len(notices) == 2, notices
        assert notices[0].startswith(DRIVER) and notices[1].startswith(OFFERED)
        text = k8s.to_yaml(manifest)
        for notice in notices:
            assert f"# Notice: {notice}\n" in text.split("apiVersion")[0]
        assert yaml.safe_load(text)["metadata"]["annotations"][NOTICE_ANNOTATION] == \
            "\n".join(notices)


def test_no_notice_leaves_the_artefacts_as_they_were():
    manifest = written("k8s", "--kind", "mpijob", *PLAIN, command=COMMAND)
    assert "annotations" not in manifest["metadata"]
    assert "# Notice" not in written("sbatch", *PLAIN, command=COMMAND)
    definition = written("jobdef", *PLAIN, command=COMMAND)
    assert not [key for key in definition["tags"] if "notice" in key]
