"""The NVIDIA driver on this node against the CUDA in the image (issue 33), on every GPU node
before sshd, the rendezvous or any rank.

Probed (``probe``, into the node facts):

- the driver: ``nvidia-smi --query-gpu=driver_version --format=csv,noheader`` (one line per GPU,
  e.g. ``550.54.15``), else the first line of ``/proc/driver/nvidia/version``, which the kernel
  module writes as ``NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5
  22:23:56 UTC 2024`` (proprietary module) or ``NVRM version: NVIDIA UNIX Open Kernel Module for
  x86_64  565.57.01  Release Build  (dvs-builder@U16-A24-9-2)  Thu Oct 10 12:15:00 UTC 2024``
  (open module; both formats quoted in https://github.com/nix-community/nixGL/issues/186 and
  /issues/121, the open one built by NVIDIA/open-gpu-kernel-modules utils.mk);
- the image's CUDA, from the image's own records: ``CUDA_VERSION`` (set by NVIDIA's
  nvidia/cuda images), ``/usr/local/cuda/version.json`` (CUDA 11.1 and later toolkits),
  ``/usr/local/cuda/version.txt`` (``CUDA Version 10.1.243``), else the version of the CUDA
  runtime wheel (``nvidia-cuda-runtime``, the cuda layer's source pip: its dist-info);
- CUDA's forward-compatibility libraries: ``libcuda.so.<driver>`` under
  ``/usr/local/cuda/compat`` (NVIDIA's cuda-compat-<major>-<minor> package, which nvidia/cuda
  images carry), with the driver release they come from.

Decided (``apply``, a pure function of the facts, in the plan): the driver's floor for the
image's CUDA (``FLOORS``: the minimum under minor-version compatibility from CUDA 11, the
toolkit's own driver before it). Below it, forward compatibility is used where NVIDIA supports it
(a data center GPU, a host driver branch of NVIDIA's support matrix (``BRANCHES``) that is a Long
Term Support or Production branch not past its end of life on the day of the run, compat
libraries new enough): the compat folder goes first on ``LD_LIBRARY_PATH`` for the ranks, with a
note. Otherwise the plan has a PROBLEM naming this node, the driver found, the floor and its
source, and why not (an end-of-life branch is named with its date): a real run stops there with
the configuration class (exit 2, not retried), because every host of the same AMI has the same
driver, so a retry on another host of the compute environment fails the same way. A driver that
meets the floor on a branch past its end of life is a note saying so.

``MNP_DRIVER_CHECK=warn`` makes that problem a note; ``off`` skips the check.

The floors and branches are matrix/model/drivers.yaml's (tests/test_drivers.py holds the two
equal).
"""

import datetime
import glob
import json
import os
import re

from ..core import versions

MODES = ("on", "warn", "off")
DATA = "matrix/model/drivers.yaml"
_MINOR = ("https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html "
          "section \"CUDA 11 and Later Defaults to Minor Version Compatibility\" (Table 1)")
_NOTES = "https://docs.nvidia.com/cuda/archive/{}/cuda-toolkit-release-notes/index.html"
# CUDA release -> (minimum Linux driver, source). From CUDA 11 one floor holds for a whole major
# release (minor-version compatibility); before it, each release needs its toolkit's driver.
FLOORS = {
    "10.1": ("418.39", _NOTES.format("10.1") + " section \"CUDA Driver\", table \"CUDA "
             "Toolkit and Compatible Driver Versions\" (CUDA 10.1 (10.1.105 general release, "
             "and updates) >= 418.39; no minor-version compatibility before CUDA 11)"),
    "11": ("450.80.02", _MINOR + "; " + _NOTES.format("11.7.1") + " Table 2 (CUDA 11.x "
           ">= 450.80.02)"),
    "12": ("525.60.13", _MINOR + "; " + _NOTES.format("12.1.1") + " Table 2 (CUDA 12.x "
           ">= 525.60.13)"),
    "13": ("580", _MINOR + " (CUDA 13.x >= 580)"),
}
COMPAT_SOURCE = ("https://docs.nvidia.com/deploy/cuda-compatibility/forward-compatibility.html "
                 "section \"Forward Compatibility Support Across Major Toolkit Versions\" "
                 "(NVIDIA Data Center GPUs, select NGC Server Ready RTX SKUs and Jetson only)")
# NVIDIA's data center driver branches: branch -> (designation, end of life as YYYY-MM), every
# branch of its support matrix (the edition of BRANCHES_SOURCE) and those earlier editions listed
# (matrix/model/drivers.yaml `branches`, each with its edition). Forward compatibility is offered
# from a branch of COMPAT_DESIGNATIONS not past its end of life on the day of the run; a branch
# is past it from the first day of the month after the one NVIDIA gives.
LTSB, PB, NFB = "Long Term Support Branch", "Production Branch", "New Feature Branch"
BRANCHES = {
    "620": (LTSB, "2029-09"),
    "595": (PB, "2027-03"),
    "580": (LTSB, "2028-06"),
    "610": (NFB, "2026-08"),
    "570": (PB, "2026-02"),
    "535": (LTSB, "2026-06"),
}
COMPAT_DESIGNATIONS = (LTSB, PB)
BRANCHES_SOURCE = ("https://docs.nvidia.com/datacenter/tesla/drivers/620/"
                   "supported-drivers-and-cuda-toolkit-versions.html Table 2 \"CUDA and Drivers\" "
                   "(edition 620: R580 LTSB to June 2028, R595 Production Branch to March 2027, "
                   "R620 LTSB to September 2029; every branch not listed is end of life)")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December")
COMPAT_DIRS = ("/usr/local/cuda/compat", "/usr/local/cuda-*/compat")
# GPU names as nvidia-smi prints them. Data center products (https://developer.nvidia.com/
# cuda-gpus, "Data Center Products"); consumer and workstation names are never data center ones
# (the select RTX Server Ready SKUs are not told apart by name: refused, MNP_DRIVER_CHECK=warn).
DATACENTER_RE = re.compile(r"\b(Tesla|[ABHL]\d{1,3}[A-Z]?|GH200|GB\d{3}|B\d{3}|T4|V100|P100|"
                           r"P40|P4|K80|M60)\b")
CONSUMER_RE = re.compile(r"GeForce|TITAN|Quadro|RTX", re.IGNORECASE)
SMI_ARGV = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
PROC_VERSION = "/proc/driver/nvidia/version"
NVRM_RE = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)\s")
CUDA_TXT_RE = re.compile(r"CUDA Version (\d+\.\d+(?:\.\d+)?)")
RUNTIME_WHEELS = ("nvidia_cuda_runtime", "nvidia_cuda_runtime_cu13", "nvidia_cuda_runtime_cu12",
                  "nvidia_cuda_runtime_cu11")


def _under(root, path):
    return os.path.join(root, path.lstrip("/"))


def _read(path):
    try:
        with open(path) as handle:
            return handle.read()
    except (OSError, IOError, UnicodeDecodeError):
        return None


# -- probing ---------------------------------------------------------------------------------------

def driver_version(run, root="/"):
    """``(version, where)`` of the NVIDIA driver, or ``(None, None)``."""
    out = run(list(SMI_ARGV))
    if out:
        found = [line.strip() for line in out.splitlines() if versions.release(line.strip())]
        if found:
            return found[0], "nvidia-smi --query-gpu=driver_version"
    text = _read(_under(root, PROC_VERSION))
    match = NVRM_RE.search(text or "")
    if match:
        return match.group(1), PROC_VERSION
    return None, None


def image_cuda(environ, root="/", package_version=None):
    """``(version, where)`` of the image's CUDA from the image's own records, or ``(None, None)``."""
    value = (environ.get("CUDA_VERSION") or "").strip()
    if versions.release(value):
        return value, "CUDA_VERSION (the image's environment)"
    text = _read(_under(root, "/usr/local/cuda/version.json"))
    if text:
        try:
            value = json.loads(text)["cuda"]["version"]
            if versions.release(value):
                return value, "/usr/local/cuda/version.json"
        except (ValueError, KeyError, TypeError):
            pass
    match = CUDA_TXT_RE.search(_read(_under(root, "/usr/local/cuda/version.txt")) or "")
    if match:
        return match.group(1), "/usr/local/cuda/version.txt"
    for name in RUNTIME_WHEELS if package_version else ():
        value, where = package_version(name, root)
        if value:
            return value, where
    return None, None


def find_compat(root="/"):
    """``{"dir", "driver"}`` of the forward-compatibility libraries in the image, or ``None``:
    the folder holding ``libcuda.so.<driver release>``."""
    for pattern in COMPAT_DIRS:
        for folder in sorted(glob.glob(_under(root, pattern))):
            for lib in sorted(glob.glob(os.path.join(folder, "libcuda.so.*"))):
                match = re.search(r"libcuda\.so\.(\d+\.\d+(?:\.\d+)?)$", lib)
                if match:
                    inside = "/" + os.path.relpath(folder, root).lstrip("./")
                    return {"dir": os.path.normpath(inside), "driver": match.group(1)}
    return None


def probe(facts, environ, root, run, package_version):
    """Fill the facts' driver fields (the driver only on a GPU node: nvidia-smi is the GPU's),
    and the day of the run (a driver branch's end of life is checked against it)."""
    facts.run_date = datetime.date.today().isoformat()
    facts.cuda_version, facts.cuda_source = image_cuda(environ, root, package_version)
    facts.cuda_compat = find_compat(root)
    if facts.gpus:
        facts.driver_version, facts.driver_source = driver_version(run, root)


# -- deciding --------------------------------------------------------------------------------------

def floor(cuda):
    """``(minimum driver, source)`` for CUDA release ``cuda``, or ``None`` when unknown."""
    release = versions.release(cuda)
    if not release:
        return None
    if release[0] >= 11:
        return FLOORS.get(str(release[0]))
    return FLOORS.get("%d.%d" % (release[0], (release + (0,))[1]))


def _at_least(version, minimum):
    return bool(versions.in_range(version, ">=" + minimum))


def branch(version):
    release = versions.release(version)
    return str(release[0]) if release else None


def datacenter(name):
    """Whether NVIDIA's forward compatibility covers a GPU of this (nvidia-smi) name."""
    return bool(DATACENTER_RE.search(name)) and not CONSUMER_RE.search(name)


def run_day(facts):
    """The day of the run: the facts' (probed at start), else today."""
    try:
        return datetime.datetime.strptime(facts.run_date or "", "%Y-%m-%d").date()
    except (TypeError, ValueError):
        return datetime.date.today()


def month_words(month):
    """``2026-06`` -> ``June 2026``."""
    year, number = month.split("-")
    return "%s %s" % (MONTHS[int(number) - 1], year)


def past_end_of_life(host, day):
    """Whether branch ``host`` is past its end of life on ``day`` (a branch the matrix does not
    list is: NVIDIA's note under its table)."""
    found = BRANCHES.get(host)
    if found is None:
        return True
    year, month = (int(part) for part in found[1].split("-"))
    return (day.year, day.month) > (year, month)


def qualifying_branches(day):
    """The branches forward compatibility is offered from on ``day``, newest first."""
    return [name for name in sorted(BRANCHES, key=int, reverse=True)
            if BRANCHES[name][0] in COMPAT_DESIGNATIONS and not past_end_of_life(name, day)]


def branch_refusal(host, day):
    """Why forward compatibility is not offered from driver branch ``host`` on ``day``
    (``None``: it is)."""
    found = BRANCHES.get(host)
    if found is None:
        return ("driver branch R%s is not in NVIDIA's data center driver support matrix, which "
                "holds every branch it does not list end of life [%s]" % (host, BRANCHES_SOURCE))
    designation, end = found
    if designation not in COMPAT_DESIGNATIONS:
        return ("driver branch R%s is a %s, and forward compatibility is offered from %s "
                "branches only [%s]" % (host, designation, " and ".join(COMPAT_DESIGNATIONS),
                                        BRANCHES_SOURCE))
    if past_end_of_life(host, day):
        return ("driver branch R%s (%s) reached its end of life in %s, before %s [%s]"
                % (host, designation, month_words(end), day.isoformat(), BRANCHES_SOURCE))
    return None


def compat_refusal(driver, gpu_names, compat, minimum, day=None):
    """Why forward compatibility cannot carry this node on ``day`` (``None``: it can)."""
    why = branch_refusal(branch(driver), day or datetime.date.today())
    if why:
        return why
    if compat is None:
        return ("the image carries no CUDA forward-compatibility libraries (libcuda.so.* in %s)"
                % " or ".join(COMPAT_DIRS))
    if not _at_least(compat["driver"], minimum):
        return ("the image's forward-compatibility libraries (%s, driver %s) are older than %s"
                % (compat["dir"], compat["driver"], minimum))
    if not gpu_names:
        return "the GPU model is unknown (nvidia-smi -L named none)"
    others = sorted(set(n for n in gpu_names if not datacenter(n)))
    if others:
        return ("forward compatibility needs a data center GPU, and %s is not one [%s]"
                % (", ".join(others), COMPAT_SOURCE))
    return None


def check(facts, mode="on"):
    """The comparison as a record, or ``None`` on a node without NVIDIA GPUs or with the check
    off: ``{"driver", "driver_source", "cuda", "cuda_source", "minimum", "minimum_source",
    "verdict": ok | compat | below | unknown, "line", "compat_dir"}``."""
    if facts.accelerator != "gpu" or mode == "off":
        return None
    if not facts.cuda_version and not facts.driver_version:
        return None  # nothing to compare (``invoke explain``'s facts, an image without CUDA)
    record = {"driver": facts.driver_version, "driver_source": facts.driver_source,
              "cuda": facts.cuda_version, "cuda_source": facts.cuda_source, "minimum": None,
              "minimum_source": None, "compat_dir": None}
    found = floor(facts.cuda_version) if facts.cuda_version else None
    if not facts.cuda_version or found is None or not facts.driver_version:
        what = ("the image's CUDA is unknown" if not facts.cuda_version else
                "no driver floor is known for CUDA %s (%s)" % (facts.cuda_version, DATA)
                if found is None else "the driver version is unknown (%s and %s gave none)"
                % (" ".join(SMI_ARGV), PROC_VERSION))
        record.update(verdict="unknown", line="NVIDIA driver not checked: %s" % what)
        return record
    minimum, source = found
    record.update(minimum=minimum, minimum_source=source)
    compared = ("NVIDIA driver %s (%s) vs CUDA %s (%s): needs >= %s [%s]"
                % (facts.driver_version, facts.driver_source, facts.cuda_version,
                   facts.cuda_source, minimum, source))
    day = run_day(facts)
    if _at_least(facts.driver_version, minimum):
        host = branch(facts.driver_version)
        ended = (" (driver branch R%s reached its end of life in %s: NVIDIA no longer fixes it [%s])"
                 % (host, month_words(BRANCHES[host][1]), BRANCHES_SOURCE)
                 if host in BRANCHES and past_end_of_life(host, day) else "")
        record.update(verdict="ok", line=compared + ": met" + ended)
        return record
    why_not = compat_refusal(facts.driver_version, facts.gpu_names, facts.cuda_compat, minimum,
                             day)
    if why_not is None:
        record.update(verdict="compat", compat_dir=facts.cuda_compat["dir"],
                      line="%s: below it, so CUDA forward compatibility is used: %s (driver %s) "
                           "first on LD_LIBRARY_PATH [%s; %s]"
                           % (compared, facts.cuda_compat["dir"], facts.cuda_compat["driver"],
                              COMPAT_SOURCE, BRANCHES_SOURCE))
        return record
    record.update(verdict="below",
                  line="node %s: NVIDIA driver %s (%s) is older than the %s-series floor %s that "
                       "the image's CUDA %s (%s) needs [%s]; no forward compatibility: %s. Every "
                       "host of this AMI has this driver: run the job on an AMI whose driver is "
                       "%s or newer (docs/entrypoint.md \"NVIDIA driver\")"
                       % (facts.address, facts.driver_version, facts.driver_source,
                          branch(minimum), minimum, facts.cuda_version, facts.cuda_source,
                          source, why_not, minimum))
    return record


def apply(plan, env, full, facts, mode="on"):
    """The check in the plan: a note with the comparison, the compat folder first on the ranks'
    ``LD_LIBRARY_PATH`` (``env``, the record; ``full``, the command's environment), or a PROBLEM
    (``MNP_DRIVER_CHECK=warn``: a note)."""
    record = check(facts, mode)
    if record is None:
        return None
    if record["verdict"] == "below":
        if mode == "warn":
            plan.notes.append("MNP_DRIVER_CHECK=warn, going on: " + record["line"])
        else:
            plan.problems.append(record["line"])
        return record
    plan.notes.append(record["line"])
    if record["verdict"] == "compat":
        first = record["compat_dir"]
        ours = [e for e in env.entries if e["name"] == "LD_LIBRARY_PATH"]
        rest = [p for p in (ours[0]["value"] if ours else "").split(":") if p and p != first]
        reason = "CUDA forward compatibility: the driver is older than the image's CUDA needs"
        env.set("LD_LIBRARY_PATH", ":".join([first] + rest),
                reason + ("; then " + ours[0]["reason"] if ours else ""),
                COMPAT_SOURCE + ("; " + ours[0]["source"] if ours and ours[0]["source"] else ""))
        current = [p for p in full.get("LD_LIBRARY_PATH", "").split(":") if p and p != first]
        full["LD_LIBRARY_PATH"] = ":".join([first] + current)
    return record
