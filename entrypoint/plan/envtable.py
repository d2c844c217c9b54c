"""Version-dependent settings as data: one row per (setting, value) with when it applies and why.

``plan`` evaluates ``ROWS`` against a node's facts. For each setting the *first* row whose
conditions all hold wins; a setting no row selects is not set, and the plan says so when a row
for it exists ("not set: ..."), so every decision in the dry run has its reason and source.
Adding a plugin release or a new upstream recommendation is a row here, not a code change.

Conditions (all must hold; a missing key means "any"):

- ``fabric``: ``"efa"`` or ``"tcp"`` (the fabric the plan chose).
- ``accelerator``: ``"gpu"``, ``"hpu"`` or ``"none"`` (from the node's devices or instance type).
- ``rdma``: ``True``/``False``: the instance type's EFA can do RDMA reads.
- ``nic``: ``"ena"`` or ``"other"``: the vendor of the job's network interface.
- ``present``: a component that must be installed (``"aws-ofi-nccl"``, ``"hccl-ofi-wrapper"``).
- ``nccl_node``: ``True``: the node can run NCCL (an NCCL version is known, or it has GPUs); a
  CPU or Gaudi node without NCCL gets no NCCL settings.
- a component name (``"nccl"``, ``"aws-ofi-nccl"``, ``"libfabric"``, ``"pytorch"``, ...) mapped to
  a version range such as ``">=1.6.0,<1.7.0"``. When that version is unknown the row's
  ``if_unknown`` decides (``True``: apply, ``False``: skip); the plan notes the guess.

Values may use ``{interface}``, the interface the node's address is on.

Sources are upstream documents by URL and section, or the seed article the setting came from.
"""


from ..core.versions import in_range, release  # noqa: F401 (envtable.in_range: rows use it)

CHEATSHEET = ("https://github.com/aws/aws-ofi-nccl/blob/master/doc/efa-env-var.md "
              "(EFA cheatsheet, section 1 'Settings via environment variables' and section 2 "
              "'Sample Presets')")
NCCL_DOCS = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html"
NCCL_EXACT = ("https://github.com/NVIDIA/nccl/pull/236 (exact-match '=' modifier for "
              "NCCL_SOCKET_IFNAME, first released in NCCL v2.5.6-1); " + NCCL_DOCS
              + " 'NCCL_SOCKET_IFNAME'")
NCCL_SOCKET_AUTO = ("https://github.com/NVIDIA/nccl/blob/v2.4.8-1/src/transport/net_socket.cc "
                    "(ncclSocketGetNsockNthread: vendor 0x1d0f, AWS ENA -> 2 threads x 8 "
                    "sockets; anything else -> 1 x 1)")
P3_TCP_SEED = ("https://aws.amazon.com/blogs/compute/optimizing-deep-learning-on-p3-and-p3dn-"
               "with-efa/ (AWS Compute Blog), section 'Optimizing your P3 family' "
               "(NCCL_SOCKET_NTHREADS / NCCL_NSOCKS_PERTHREAD, new in NCCL 2.4.8)")
DL1_WORKSHOP = ("https://github.com/aws-samples/aws-hpc-tutorials/tree/frameworks/content/"
                "06-batch-mnp-train-dl1 (AWS Batch DL1 workshop: .deepspeed_env of the "
                "container); docs.habana.ai API_Reference_Guides/HCCL_APIs/"
                "Scale_Out_via_Host_NIC.html (HCCL over OFI)")
HCCL_WRAPPER = ("https://github.com/HabanaAI/hccl_ofi_wrapper README.md 'Build HCCL OFI wrapper' "
                "steps 5-7 (libhccl_ofi_wrapper.so copied to /usr/lib/habanalabs, ldconfig, on "
                "LD_LIBRARY_PATH; README version 1.2, commit c3aff89c); the same steps were "
                "'Required steps' 6-8 of the version 1.0 README (commit 2862240b) only")
OFI_NET_NAME = ("https://github.com/aws/aws-ofi-nccl/blob/master/src/nccl_ofi_interface_nvidia.cpp "
                "(nvidia_plugin_name_fixup: 'Versions 1.11.0 and prior of the plugin set the "
                "name to \"AWS Libfabric\"'; later ones report \"Libfabric\" and still accept "
                "NCCL_NET=\"AWS Libfabric\"), from https://github.com/aws/aws-ofi-nccl/pull/530 "
                "(commit 7c014f0d, merged to master after the 1.11 release). It first ships in "
                "v1.13.0-aws, the first release from master after it (RELEASENOTES.md "
                "'v1.13.0-aws (2024-11-18)'): v1.12.0-aws and v1.12.1-aws come from the "
                "v1.12.x-aws release branch, whose notes list only tuner and bug-fix "
                "cherry-picks (RELEASENOTES.md 'v1.12.0-aws release notes', 'v1.12.1-aws'; "
                "https://github.com/aws/aws-ofi-nccl/pull/653), so they still name the network "
                "\"AWS Libfabric\"; before PR #530, src/compat_v6.c (ncclNetPlugin_v6 .name "
                "\"AWS Libfabric\"); " + NCCL_DOCS + " 'NCCL_NET'; "
                "https://github.com/NVIDIA/nccl/issues/959 (silent fall-back to sockets)")
GLOO_DOCS = ("https://pytorch.org/docs/stable/distributed.html 'Common environment variables' "
             "(GLOO_SOCKET_IFNAME)")


class Row(object):
    """One setting=value with the conditions under which it applies and where that comes from."""

    def __init__(self, setting, value, when, why, source, if_unknown=False):
        self.setting = setting
        self.value = value
        self.when = dict(when)
        self.why = why
        self.source = source
        self.if_unknown = if_unknown

    def to_dict(self):
        return {"setting": self.setting, "value": self.value, "when": dict(self.when),
                "why": self.why, "source": self.source, "if_unknown": self.if_unknown}


ROWS = (
    # -- interface pinning, every fabric ------------------------------------------------------
    Row("NCCL_SOCKET_IFNAME", "={interface}", {"nccl_node": True, "nccl": ">=2.5.6"},
        "exact interface name ('=' prefix): eth0 must not also match eth01", NCCL_EXACT),
    Row("NCCL_SOCKET_IFNAME", "{interface}", {"nccl_node": True, "nccl": "<2.5.6"},
        "plain name: NCCL before 2.5.6 has no '=' exact match and would find no interface "
        "called '=eth0'", NCCL_EXACT + "; seed articles use -x NCCL_SOCKET_IFNAME=eth0",
        if_unknown=True),
    Row("GLOO_SOCKET_IFNAME", "{interface}", {},
        "PyTorch's gloo backend binds to this interface", GLOO_DOCS),
    # -- NCCL over EFA through aws-ofi-nccl ---------------------------------------------------
    Row("FI_PROVIDER", "efa", {"fabric": "efa", "accelerator": "gpu", "present": "aws-ofi-nccl",
                               "aws-ofi-nccl": "<1.6.0"},
        "aws-ofi-nccl <= 1.5.0 needs libfabric pinned to the efa provider", CHEATSHEET),
    Row("NCCL_PROTO", "simple", {"fabric": "efa", "accelerator": "gpu",
                                 "present": "aws-ofi-nccl", "aws-ofi-nccl": "<1.6.0"},
        "aws-ofi-nccl <= 1.5.0: EFA did not support NCCL's LL/LL128 protocols", CHEATSHEET),
    Row("FI_EFA_USE_DEVICE_RDMA", "1", {"fabric": "efa", "accelerator": "gpu", "rdma": True,
                                        "present": "aws-ofi-nccl", "aws-ofi-nccl": "<1.7.0"},
        "GPUDirect RDMA over EFA: aws-ofi-nccl < 1.7.0 does not enable it by itself",
        CHEATSHEET, if_unknown=True),
    Row("FI_EFA_USE_DEVICE_RDMA", "1", {"fabric": "efa", "accelerator": "gpu", "rdma": True,
                                        "present": "aws-ofi-nccl", "libfabric": "<1.18.0"},
        "GPUDirect RDMA over EFA: libfabric < 1.18.0 does not enable it by itself",
        CHEATSHEET, if_unknown=True),
    # NCCL_NET names the network NCCL must use: with it, a plugin that fails to load is an
    # error at NCCL's init instead of a silent fall-back to its sockets (the preflight checks the
    # same before any rank starts). The name is the plugin's ncclNet ``name`` field.
    Row("NCCL_NET", "Libfabric", {"fabric": "efa", "nccl_node": True,
                                  "present": "aws-ofi-nccl", "aws-ofi-nccl": ">=1.13.0"},
        "pin NCCL to the aws-ofi-nccl plugin (its name from 1.13.0 on): no silent fall-back "
        "to sockets", OFI_NET_NAME),
    Row("NCCL_NET", "AWS Libfabric", {"fabric": "efa", "nccl_node": True,
                                      "present": "aws-ofi-nccl", "aws-ofi-nccl": "<1.13.0"},
        "pin NCCL to the aws-ofi-nccl plugin (its name up to 1.12.x, still accepted after): "
        "no silent fall-back to sockets", OFI_NET_NAME, if_unknown=True),
    # -- NCCL over TCP sockets ----------------------------------------------------------------
    Row("NCCL_SOCKET_NTHREADS", "2", {"fabric": "tcp", "accelerator": "gpu", "nic": "other",
                                      "nccl": ">=2.4.8"},
        "the interface is not an AWS ENA, so NCCL would use 1 thread x 1 socket (capped near "
        "10 Gbps per stream); 2 x 8 is what NCCL picks on ENA",
        NCCL_SOCKET_AUTO + "; " + P3_TCP_SEED, if_unknown=True),
    Row("NCCL_NSOCKS_PERTHREAD", "8", {"fabric": "tcp", "accelerator": "gpu", "nic": "other",
                                       "nccl": ">=2.4.8"},
        "the interface is not an AWS ENA: 8 sockets per thread, as NCCL picks on ENA",
        NCCL_SOCKET_AUTO + "; " + P3_TCP_SEED, if_unknown=True),
    Row("NCCL_NET", "Socket", {"fabric": "tcp", "present": "aws-ofi-nccl"},
        "an OFI plugin is installed: keep NCCL on its own sockets instead of libfabric's tcp "
        "provider", "https://github.com/aws/aws-ofi-nccl/issues/803 ('Selected Provider is tcp')"),
    # -- Gaudi: HCCL over EFA through Habana's OFI wrapper -----------------------------------
    Row("HCCL_OVER_OFI", "1", {"fabric": "efa", "accelerator": "hpu",
                               "present": "hccl-ofi-wrapper"},
        "HCCL scale-out over libfabric (host NIC, EFA) instead of auto-detection", DL1_WORKSHOP),
    Row("HCCL_OVER_TCP", "0", {"fabric": "efa", "accelerator": "hpu",
                               "present": "hccl-ofi-wrapper"},
        "not HCCL's TCP sockets when EFA is there", DL1_WORKSHOP),
    Row("HCCL_SOCKET_IFNAME", "{interface}", {"accelerator": "hpu"},
        "HCCL's bootstrap sockets on the job's interface", DL1_WORKSHOP),
)

# Settings whose absence the plan explains even when no row applies (so a reader sees why a
# setting an older guide used is not set now).
NOT_SET_REASONS = {
    "FI_PROVIDER": (("gpu",), "only aws-ofi-nccl <= 1.5.0 needs it (" + CHEATSHEET + ")"),
    "NCCL_PROTO": (("gpu",), "only aws-ofi-nccl <= 1.5.0 needs it (" + CHEATSHEET + ")"),
    "FI_EFA_USE_DEVICE_RDMA": (("gpu",), "no RDMA-capable EFA here, or aws-ofi-nccl >= 1.7.0 "
                               "with libfabric >= 1.18.0 enables it by itself (" + CHEATSHEET
                               + ")"),
    "FI_EFA_TX_MIN_CREDITS": (("gpu",), "older guides set 64, e.g. AWS's 'Optimizing deep learning on "
                              "P3 and P3dn with EFA' ("
                              + P3_TCP_SEED.split(" ")[0] + ", its mpirun line with NCCL "
                              "2.4.8). Unset keeps the efa provider's default: "
                              "its maintainers found the credit request unused and the "
                              "default the better bandwidth (https://github.com/ofiwg/"
                              "libfabric/pull/7650 'prov/efa: remove unused credit "
                              "calculation'), and the current aws-ofi-nccl cheatsheet has no "
                              "such setting (" + CHEATSHEET + ")"),
    "NCCL_SOCKET_NTHREADS": (("gpu",), "not over TCP, or the interface is an AWS ENA and NCCL "
                             "picks 2 threads x 8 sockets itself (" + NCCL_SOCKET_AUTO + ")"),
    "NCCL_NSOCKS_PERTHREAD": (("gpu",), "not over TCP, or the interface is an AWS ENA and NCCL "
                              "picks 2 threads x 8 sockets itself (" + NCCL_SOCKET_AUTO + ")"),
    "RDMAV_FORK_SAFE": (("gpu",), "the cheatsheet says do not use it: on newer kernels it can "
                        "break things, and the plugin sets FI_EFA_FORK_SAFE itself where needed ("
                        + CHEATSHEET + ")"),
    "HCCL_OVER_OFI": (("hpu",), "not over EFA, or Habana's hccl_ofi_wrapper is not installed ("
                      + HCCL_WRAPPER + ")"),
}



CONTEXT_KEYS = ("fabric", "accelerator", "rdma", "nic", "present", "nccl_node")


def matches(row, context, versions):
    """``(applies, guesses)``: whether ``row`` applies, and the unknown versions it guessed."""
    guesses = []
    for key, wanted in sorted(row.when.items()):
        if key in CONTEXT_KEYS:
            have = context.get(key)
            if key == "present":
                if wanted not in (have or ()):
                    return False, []
            elif have != wanted:
                return False, []
            continue
        ok = in_range(versions.get(key), wanted)
        if ok is None:
            if not row.if_unknown:
                return False, []
            guesses.append("%s version unknown" % key)
        elif not ok:
            return False, []
    return True, guesses


def select(context, versions, interface):
    """``[(row, value, guesses)]``: the first applying row per setting, in table order."""
    chosen = {}
    order = []
    for row in ROWS:
        if row.setting in chosen:
            continue
        applies, guesses = matches(row, context, versions)
        if not applies:
            continue
        if "{interface}" in row.value and not interface:
            continue
        chosen[row.setting] = (row, row.value.replace("{interface}", interface or ""), guesses)
        order.append(row.setting)
    return [chosen[name] for name in order]
