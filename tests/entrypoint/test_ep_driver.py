"""Issue 33: the NVIDIA driver on the node against the image's CUDA, checked at start.

No GPU here: the driver is read from stand-ins in the formats real drivers print.

- ``nvidia-smi --query-gpu=driver_version --format=csv,noheader`` prints one bare version a GPU
  (``nvidia-smi --help-query-gpu``: "driver_version: The version of the installed NVIDIA display
  driver"), and ``nvidia-smi -L`` one ``GPU <i>: <name> (UUID: GPU-<uuid>)`` line a GPU (nvidia-smi(1),
  "-L, --list-gpus").
- ``/proc/driver/nvidia/version``, proprietary and open kernel modules, as quoted in
  https://github.com/nix-community/nixGL/issues/186 (open: ``NVRM version: NVIDIA UNIX Open
  Kernel Module for x86_64  565.57.01  Release Build  (dvs-builder@U16-A24-9-2)  Thu Oct 10
  12:15:00 UTC 2024``) and the proprietary form nixGL's ``.*Module  ([0-9.]+)  .*`` matched
  (nixGL.nix line 236 at 310f8e49a149e4c9ea52f1adf70cdc768ec53f8a).
"""

import json
import os

import pytest

from entrypoint.core import errors
from entrypoint.plan import make as plan_mod
from entrypoint.probe import driver, slots
from entrypoint.probe.facts import NodeFacts, python_package_version
from entrypoint.settings import config

PROC_PROPRIETARY = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 "
                    "22:23:56 UTC 2024\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
PROC_OPEN = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  565.57.01  Release Build  "
             "(dvs-builder@U16-A24-9-2)  Thu Oct 10 12:15:00 UTC 2024\nGCC version:  gcc version "
             "13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)\n")
H100 = "NVIDIA H100 80GB HBM3"
RTX = "NVIDIA GeForce RTX 4090"


def smi_script(version, name=H100, gpus=2):
    """A stand-in nvidia-smi answering the two queries the entrypoint makes."""
    listing = "\\n".join(f"GPU {i}: {name} (UUID: GPU-0000000{i}-1111-2222-3333-444444444444)"
                         for i in range(gpus))
    return ("#!/bin/sh\ncase \"$*\" in\n"
            f"  -L) printf '{listing}\\n' ;;\n"
            f"  '--query-gpu=driver_version --format=csv,noheader') for i in $(seq {gpus}); do "
            f"echo {version}; done ;;\n"
            "  *) exit 6 ;;\nesac\n")


# -- reading the driver, the image's CUDA and the compat libraries ---------------------------------

def test_the_driver_is_read_from_a_stand_in_nvidia_smi(local_node, monkeypatch):
    bindir = local_node.fake_program("nvidia-smi", smi_script("550.54.15"))
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    assert driver.driver_version(slots.run_tool) == ("550.54.15",
                                                     "nvidia-smi --query-gpu=driver_version")
    found = slots.detect(root="/", run=slots.run_tool)
    assert found.names == [H100, H100]


@pytest.mark.parametrize(("text", "version"), [(PROC_PROPRIETARY, "550.54.15"),
                                               (PROC_OPEN, "565.57.01")])
def test_without_nvidia_smi_the_kernel_modules_version_file_is_read(tmp_path, text, version):
    proc = tmp_path / "proc" / "driver" / "nvidia"
    proc.mkdir(parents=True)
    (proc / "version").write_text(text)
    assert driver.driver_version(lambda argv: None, str(tmp_path)) == (
        version, "/proc/driver/nvidia/version")
    assert driver.driver_version(lambda argv: None, str(tmp_path / "none")) == (None, None)


def test_the_images_cuda_comes_from_its_own_records(tmp_path):
    root = str(tmp_path)
    assert driver.image_cuda({"CUDA_VERSION": "12.1.1"}, root) == (
        "12.1.1", "CUDA_VERSION (the image's environment)")
    cuda = tmp_path / "usr" / "local" / "cuda"
    cuda.mkdir(parents=True)
    (cuda / "version.txt").write_text("CUDA Version 10.1.243\n")
    assert driver.image_cuda({}, root) == ("10.1.243", "/usr/local/cuda/version.txt")
    (cuda / "version.json").write_text(json.dumps({"cuda": {"name": "CUDA SDK",
                                                            "version": "11.7.1"}}))
    assert driver.image_cuda({}, root) == ("11.7.1", "/usr/local/cuda/version.json")
    # the cuda layer's source pip: the CUDA runtime wheel's dist-info
    bare = tmp_path / "wheels"
    site = bare / "usr" / "local" / "lib" / "python3.11" / "dist-packages"
    (site / "nvidia_cuda_runtime-13.2.86.dist-info").mkdir(parents=True)
    version, where = driver.image_cuda({}, str(bare), python_package_version)
    assert version == "13.2.86" and where.endswith("nvidia_cuda_runtime-13.2.86.dist-info")


def test_the_compat_libraries_and_their_driver_are_found(tmp_path):
    assert driver.find_compat(str(tmp_path)) is None
    compat = tmp_path / "usr" / "local" / "cuda-13.2" / "compat"
    compat.mkdir(parents=True)
    (compat / "libcuda.so.580.82.07").write_text("")
    assert driver.find_compat(str(tmp_path)) == {"dir": "/usr/local/cuda-13.2/compat",
                                                 "driver": "580.82.07"}


# -- the comparison and the plan -------------------------------------------------------------------

# A day when NVIDIA still supported R535 (end of life June 2026) and R570 (February 2026): the
# only days forward compatibility could carry a CUDA 13 image (every branch in life after them,
# R580 and newer, meets CUDA 13's floor itself).
BEFORE_R570_EOL = "2026-01-15"


def gpu_facts(driver_version, cuda="13.2.86", names=(H100,), compat=None, run_date=None):
    return NodeFacts(gpus=len(names) or 1, gpu_names=list(names), slots=len(names) or 1,
                     slots_source="nvidia-smi -L", address="10.0.3.7",
                     driver_version=driver_version,
                     driver_source="nvidia-smi --query-gpu=driver_version",
                     cuda_version=cuda, cuda_source="CUDA_VERSION (the image's environment)",
                     cuda_compat=compat, run_date=run_date)


def plan_of(facts, **env):
    return plan_mod.make_plan(config.load(env), facts, ["python3", "train.py"], {})


def test_a_driver_below_the_floor_is_a_problem_naming_node_driver_floor_and_source():
    plan = plan_of(gpu_facts("550.54.15"))
    (problem,) = plan.problems
    assert problem.startswith("node 10.0.3.7: NVIDIA driver 550.54.15 (nvidia-smi")
    assert "580-series floor 580" in problem and "CUDA 13.2.86" in problem
    assert "minor-version-compatibility.html" in problem
    assert "driver branch R550 is not in NVIDIA's data center driver support matrix" in problem
    assert "\n" not in problem
    assert "PROBLEM (a real run stops here): node 10.0.3.7: NVIDIA driver 550.54.15" in plan.text()


def test_a_driver_at_or_above_the_floor_is_a_note_only():
    plan = plan_of(gpu_facts("580.82.07"))
    assert plan.problems == []
    assert any(n.startswith("NVIDIA driver 580.82.07 (nvidia-smi") and n.endswith(": met")
               for n in plan.notes), plan.notes
    assert "compat" not in (plan.value("LD_LIBRARY_PATH") or "")


@pytest.mark.parametrize(("cuda", "below", "at"), [
    ("10.1.243", "418.30", "418.87.00"), ("11.7.1", "450.51.06", "450.80.02"),
    ("12.1.1", "520.61.05", "525.60.13"), ("13.2.86", "575.57.08", "580.65.06"),
])
def test_each_cuda_release_of_the_stacks_has_its_floor(cuda, below, at):
    assert plan_of(gpu_facts(below, cuda)).problems
    assert not plan_of(gpu_facts(at, cuda)).problems


COMPAT = {"dir": "/usr/local/cuda/compat", "driver": "580.82.07"}


def test_forward_compatibility_carries_a_datacenter_gpu_on_a_supported_branch():
    plan = plan_of(gpu_facts("535.183.01", compat=COMPAT, run_date=BEFORE_R570_EOL))
    assert plan.problems == []
    assert plan.environment["LD_LIBRARY_PATH"].split(":")[0] == "/usr/local/cuda/compat"
    entry = [e for e in plan.env if e["name"] == "LD_LIBRARY_PATH"][0]
    assert entry["value"] == "/usr/local/cuda/compat"
    assert "forward-compatibility.html" in entry["source"]
    assert any("CUDA forward compatibility is used" in n for n in plan.notes), plan.notes


def test_the_compat_folder_goes_before_the_users_and_the_fabrics_library_path():
    facts = gpu_facts("535.183.01", compat=COMPAT, run_date=BEFORE_R570_EOL)
    plan = plan_mod.make_plan(config.load({}), facts, ["python3", "t.py"],
                              {"LD_LIBRARY_PATH": "/usr/local/nvidia/lib64:/opt/x"})
    assert plan.environment["LD_LIBRARY_PATH"] == \
        "/usr/local/cuda/compat:/usr/local/nvidia/lib64:/opt/x"


@pytest.mark.parametrize(("facts", "why"), [
    (gpu_facts("535.183.01", names=(RTX,), compat=COMPAT, run_date=BEFORE_R570_EOL),
     "needs a data center GPU, and NVIDIA GeForce RTX 4090 is not one"),
    (gpu_facts("550.54.15", compat=COMPAT, run_date=BEFORE_R570_EOL),
     "driver branch R550 is not in NVIDIA's data center driver support matrix"),
    (gpu_facts("535.183.01", compat={"dir": "/usr/local/cuda/compat", "driver": "575.57.08"},
               run_date=BEFORE_R570_EOL),
     "(/usr/local/cuda/compat, driver 575.57.08) are older than 580"),
    (gpu_facts("535.183.01", names=(), compat=COMPAT, run_date=BEFORE_R570_EOL),
     "the GPU model is unknown"),
    (gpu_facts("535.183.01", run_date=BEFORE_R570_EOL),
     "no CUDA forward-compatibility libraries"),
    (gpu_facts("570.86.15", compat=COMPAT, run_date="2026-03-01"),
     "driver branch R570 (Production Branch) reached its end of life in February 2026, before "
     "2026-03-01"),
])
def test_no_forward_compatibility_where_nvidia_does_not_support_it(facts, why):
    plan = plan_of(facts)
    (problem,) = plan.problems
    assert why in problem, problem
    assert "cuda/compat" not in plan.environment.get("LD_LIBRARY_PATH", "")


def test_an_end_of_life_branch_is_a_problem_naming_the_branch_and_its_date():
    """Issue 44: forward compatibility only from a branch not past its end of life on the day of
    the run. R535's end of life is June 2026 in NVIDIA's support matrix: through June 30 it is
    offered, from July 1 it is a PROBLEM naming the branch and the date."""
    last_day = plan_of(gpu_facts("535.183.01", compat=COMPAT, run_date="2026-06-30"))
    assert last_day.problems == []
    assert last_day.environment["LD_LIBRARY_PATH"].startswith("/usr/local/cuda/compat")
    after = plan_of(gpu_facts("535.183.01", compat=COMPAT, run_date="2026-07-01"))
    (problem,) = after.problems
    assert "no forward compatibility: driver branch R535 (Long Term Support Branch) reached its " \
           "end of life in June 2026, before 2026-07-01" in problem, problem
    assert "docs.nvidia.com/datacenter/tesla/drivers/620/" in problem
    assert "cuda/compat" not in after.environment.get("LD_LIBRARY_PATH", "")


def test_the_branches_that_qualify_follow_the_day_of_the_run():
    from datetime import date

    assert driver.qualifying_branches(date(2026, 1, 15)) == ["620", "595", "580", "570", "535"]
    assert driver.qualifying_branches(date(2026, 11, 29)) == ["620", "595", "580"]
    assert driver.qualifying_branches(date(2027, 4, 1)) == ["620", "580"]
    assert "is a New Feature Branch" in driver.branch_refusal("610", date(2026, 5, 1))


def test_a_driver_meeting_the_floor_on_an_ended_branch_is_a_note_saying_so():
    plan = plan_of(gpu_facts("535.183.01", cuda="12.1.1", run_date="2026-11-29"))
    assert plan.problems == []
    (note,) = [n for n in plan.notes if n.startswith("NVIDIA driver 535.183.01")]
    assert ": met (driver branch R535 reached its end of life in June 2026" in note


@pytest.mark.parametrize(("name", "datacenter"), [
    (H100, True), ("NVIDIA A100-SXM4-40GB", True), ("NVIDIA A10G", True), ("NVIDIA L4", True),
    ("NVIDIA L40S", True), ("Tesla V100-SXM2-32GB", True), ("NVIDIA B200", True),
    ("Tesla T4", True), (RTX, False), ("NVIDIA RTX A6000", False), ("Quadro RTX 8000", False),
    ("NVIDIA TITAN V", False), ("NVIDIA GeForce GTX 1080 Ti", False),
])
def test_datacenter_gpus_are_told_from_consumer_ones_by_name(name, datacenter):
    assert driver.datacenter(name) is datacenter


def test_warn_makes_the_problem_a_note_and_off_skips_the_check():
    warned = plan_of(gpu_facts("550.54.15"), MNP_DRIVER_CHECK="warn")
    assert warned.problems == []
    assert any(n.startswith("MNP_DRIVER_CHECK=warn, going on: node 10.0.3.7: NVIDIA driver "
                            "550.54.15") for n in warned.notes)
    off = plan_of(gpu_facts("550.54.15"), MNP_DRIVER_CHECK="off")
    assert off.problems == [] and not any("NVIDIA driver" in n for n in off.notes)
    with pytest.raises(config.ConfigError, match="MNP_DRIVER_CHECK"):
        config.load({"MNP_DRIVER_CHECK": "maybe"})


def test_no_check_without_gpus_and_a_note_when_one_side_is_unknown():
    cpu = NodeFacts(driver_version="550.54.15", cuda_version="13.2.86")
    assert driver.check(cpu) is None
    assert driver.check(gpu_facts(None))["line"].startswith(
        "NVIDIA driver not checked: the driver version is unknown")
    assert "the image's CUDA is unknown" in driver.check(gpu_facts("550.54.15", cuda=None))["line"]
    assert driver.check(gpu_facts(None, cuda=None)) is None


# -- the entrypoint as users start it, with a stand-in nvidia-smi ----------------------------------

def start_env(local_node, version, name=H100, **extra):
    bindir = local_node.fake_program("nvidia-smi", smi_script(version, name, gpus=1))
    return local_node.env(PATH=f"{bindir}:{os.environ['PATH']}", CUDA_VERSION="13.2.86",
                          **extra)


def test_a_real_start_on_an_old_driver_fails_the_node_in_one_line_before_the_command(
        local_node, tmp_path):
    marker = tmp_path / "ran"
    command = ["python3", "-c", f"open({str(marker)!r}, 'w').close()"]
    dry = local_node.run(command, env=start_env(local_node, "550.54.15", MNP_DRY_RUN="1"))
    assert dry.returncode == 1, dry.stdout + dry.stderr
    assert "PROBLEM (a real run stops here): node " in dry.stdout
    assert "NVIDIA driver 550.54.15 (nvidia-smi --query-gpu=driver_version) is older than the " \
           "580-series floor 580" in dry.stdout
    real = local_node.run(command, env=start_env(local_node, "550.54.15"))
    assert real.returncode == errors.CONFIGURATION_EXIT, real.stdout + real.stderr
    last = (real.stdout + real.stderr).strip().splitlines()[-1]
    assert "exit 2 (configuration on node 0): node " in last, last
    assert "NVIDIA driver 550.54.15" in last and "580" in last and "docs.nvidia.com" in last
    assert not marker.exists()


def test_a_real_start_on_an_end_of_life_branch_names_it_and_its_date(local_node, tmp_path):
    """A stand-in nvidia-smi reporting R535, whose end of life (June 2026) is past on the day
    this runs: the node fails with the branch and the date, not offered forward compatibility."""
    marker = tmp_path / "ran"
    command = ["python3", "-c", f"open({str(marker)!r}, 'w').close()"]
    real = local_node.run(command, env=start_env(local_node, "535.183.01"))
    assert real.returncode == errors.CONFIGURATION_EXIT, real.stdout + real.stderr
    last = (real.stdout + real.stderr).strip().splitlines()[-1]
    assert "NVIDIA driver 535.183.01" in last, last
    assert "driver branch R535 (Long Term Support Branch) reached its end of life in June 2026" \
        in last, last
    assert not marker.exists()


def test_a_real_start_on_a_new_driver_runs_the_command(local_node, tmp_path):
    marker = tmp_path / "ran"
    command = ["python3", "-c", f"open({str(marker)!r}, 'w').close()"]
    dry = local_node.run(command, env=start_env(local_node, "580.82.07", MNP_DRY_RUN="1"))
    assert dry.returncode == 0 and "PROBLEM" not in dry.stdout, dry.stdout + dry.stderr
    assert "note: NVIDIA driver 580.82.07 (nvidia-smi --query-gpu=driver_version) vs CUDA " \
           "13.2.86" in dry.stdout
    real = local_node.run(command, env=start_env(local_node, "580.82.07"))
    assert real.returncode == 0, real.stdout + real.stderr
    assert marker.exists()
