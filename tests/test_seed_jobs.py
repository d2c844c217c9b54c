"""The seed jobs, replayed: ``docs/seed-jobs.md`` is parsed and each row of its tables is an
assertion on the plan ``invoke explain`` computes for that job. The doc and the test cannot
drift: a row that does not hold, or that the parser cannot read, fails here."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from matrix.jobs.explain import explain
from tests.helpers import project_matrix

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "seed-jobs.md"
MATRIX = project_matrix()
EXPLAIN_LINE = re.compile(r"^explain: `invoke explain (.+)`$")
TICKED = re.compile(r"`([^`]+)`")


@dataclass
class Job:
    title: str
    args: list[str]
    rows: list[tuple[str, list[str]]] = field(default_factory=list)  # (seed cell, assertions)
    prose: str = ""  # the section's text between its title and the explain line


def parse_doc(text: str) -> list[Job]:
    jobs: list[Job] = []
    title = ""
    prose: list[str] = []
    for line in text.splitlines():
        if line.startswith("## "):
            title, prose = line[3:].strip(), []
            continue
        match = EXPLAIN_LINE.match(line)
        if match:
            jobs.append(Job(title, shlex.split(match.group(1)), prose=" ".join(prose)))
            continue
        prose.append(line)
        if jobs and line.startswith("| ") and not line.startswith(("| seed setting", "|---")):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            assert len(cells) == 3, f"{jobs[-1].title}: a row needs 3 cells: {line}"
            assertions = TICKED.findall(cells[1])
            assert assertions, f"{jobs[-1].title}: no backticked assertion in: {line}"
            jobs[-1].rows.append((cells[0], assertions))
    return jobs


def run_explain(args: list[str]):
    options, command = args, []
    if "--" in args:
        cut = args.index("--")
        options, command = args[:cut], args[cut + 1:]
    values = dict(zip(options[::2], options[1::2]))
    assert set(values) <= {"--stack", "--instance-type", "--nodes", "--launcher", "--scheduler",
                           "--rdzv"}, values
    # no --launcher: the writer's default, as invoke explain takes it
    return explain(MATRIX, values["--stack"], values["--instance-type"], int(values["--nodes"]),
                   values.get("--launcher"), command,
                   scheduler=values.get("--scheduler", "batch"), rdzv=values.get("--rdzv")).plan


def check(plan, assertion: str) -> None:
    """One assertion of the doc's grammar (see docs/seed-jobs.md)."""
    env = plan.environment
    argv = " ".join(plan.argv or [])
    for prefix, actual in (("argv: ", argv),):
        if assertion.startswith(prefix):
            assert assertion[len(prefix):] in actual, f"{assertion!r} not in {actual!r}"
            return
    simple = {"launcher": plan.launcher["unit"], "runner": plan.launcher.get("runner"),
              "fabric": plan.fabric["kind"], "slots": str(plan.slots["count"]),
              "efa devices": str(len(plan.facts["efa_devices"])),
              "scheduler": plan.role.get("scheduler"), "role": plan.role["mode"]}
    key, sep, value = assertion.partition(": ")
    if sep and key in simple:
        assert simple[key] == value, f"{assertion!r}: found {simple[key]!r}"
        return
    if assertion.startswith("file "):
        path, _, line = assertion[5:].partition(": ")
        files = {f["path"]: f["content"].splitlines() for f in plan.files}
        assert path in files, f"{assertion!r}: plan writes {sorted(files)}"
        assert line in files[path], f"{assertion!r}: {files[path]}"
        return
    if assertion.endswith(" unset"):
        name = assertion[:-6]
        assert name not in env, f"{name} is set to {env.get(name)!r}"
        return
    if " has " in assertion:
        name, _, text = assertion.partition(" has ")
        assert text in env.get(name, ""), f"{assertion!r}: {env.get(name)!r}"
        return
    name, sep, value = assertion.partition("=")
    assert sep and re.match(r"^[A-Z_][A-Z0-9_]*$", name), f"cannot read assertion {assertion!r}"
    assert plan.value(name) == value and env.get(name) == value, (
        f"{assertion!r}: the plan sets {plan.value(name)!r}")


JOBS = parse_doc(DOC.read_text(encoding="utf-8"))


def test_the_doc_lists_every_seed_job():
    titles = " ".join(job.title for job in JOBS)
    for needed in ("p3dn.24xlarge, nccl-tests over EFA", "EKS", "AWS Batch MNP", "TCP",
                   "BERT / fairseq", "DL1"):
        assert needed in titles, needed
    assert all(len(job.rows) >= 5 for job in JOBS), [(j.title, len(j.rows)) for j in JOBS]


@pytest.mark.parametrize("job", JOBS, ids=[j.title.split(".")[0] for j in JOBS])
def test_seed_job(job):
    plan = run_explain(job.args)
    assert plan.problems == [], plan.problems
    failures = []
    for seed, assertions in job.rows:
        for assertion in assertions:
            try:
                check(plan, assertion)
            except AssertionError as exc:
                failures.append(f"[{seed}] {exc}")
    assert not failures, "\n".join(failures)


def test_the_checker_can_fail():
    """Each assertion form rejects a wrong value (a test that cannot fail proves nothing)."""
    plan = run_explain(JOBS[0].args)
    for wrong in ("NCCL_SOCKET_IFNAME==eth0", "FI_PROVIDER=efa", "NCCL_SOCKET_IFNAME unset",
                  "argv: -np 17", "launcher: deepspeed", "fabric: tcp", "slots: 4",
                  "efa devices: 2", "LD_LIBRARY_PATH has /nowhere", "file /x: A=b",
                  "not an assertion"):
        with pytest.raises(AssertionError):
            check(plan, wrong)


def _command(job: Job) -> list[str]:
    return job.args[job.args.index("--") + 1:] if "--" in job.args else []


def test_nccl_tests_commands_name_a_binary_the_stack_installs():
    """Issue 16 item 11: a job that runs nccl-tests names the path the stack's nccl-tests layer
    installs (its options.prefix/bin, on PATH, as the rendered Dockerfile copies it), or says
    that its stack has no nccl-tests layer."""
    runs = [job for job in JOBS if _command(job) and _command(job)[0].endswith("_perf")]
    assert runs, "no seed job runs nccl-tests"
    for job in runs:
        binary = _command(job)[0]
        name = binary.rsplit("/", 1)[-1]
        stack_name = job.args[job.args.index("--stack") + 1]
        layer = MATRIX.stack(stack_name).layer("nccl-tests")
        if layer is None:
            assert f"`{stack_name}` stack has no nccl-tests layer" in job.prose, job.title
            continue
        bindir = f"{layer.spec['options']['prefix']}/bin"
        assert binary in (name, f"{bindir}/{name}"), f"{job.title}: {binary} is not in {bindir}"
        dockerfile = next((ROOT / "images" / "generated" / stack_name).glob("*-nccl-tests.Dockerfile"))
        text = dockerfile.read_text(encoding="utf-8")
        assert f"ENV PATH={bindir}:$PATH" in text and f"test -x {bindir}/all_reduce_perf" in text


# -- the articles' own values -------------------------------------------------------------------
# The tables above were written from the plan: they show what the plan sets. These rows are what
# the seed articles set, each with the article's words (a short quote), checked against the same
# plan: "kept" means the plan sets the article's value, "replaced" that it deliberately sets
# something else (``ours``; None: leaves it unset), "yours" that the plan leaves it to the job
# definition (the article's program setting). A row's value must appear in its quote, so the
# data cannot drift from the words it was taken from.
P3DN_EFA = ('AWS Compute Blog, "Optimizing deep learning on P3 and P3dn with EFA", '
            'section "Synthetic two-node performance"')
P3_TCP = ('AWS Compute Blog, "Optimizing deep learning on P3 and P3dn with EFA", '
          'section "Optimizing your P3 family"')
P3DN_FAIRSEQ = ('AWS Compute Blog, "Optimizing deep learning on P3 and P3dn with EFA", '
                'section "FAIRSEQ ML training on a P3dn cluster"')
BATCH_FSX = ('AWS Compute Blog, "Scalable deep learning training using multi-node parallel jobs '
             'with AWS Batch and Amazon FSx for Lustre"')
DLAMI_BERT = ('AWS Machine Learning Blog, "Multi-GPU distributed deep learning training at scale '
              'with Ubuntu18 DLAMI, EFA on P3dn instances, and Amazon FSx for Lustre"')
EKS = ("AWS Machine Learning Blog, PyTorch training with Torch Distributed Elastic on Amazon EKS "
       '(aws-do-eks), section "Network acceleration"')
EKS_TRAIN = ("AWS Machine Learning Blog, PyTorch training with Torch Distributed Elastic on "
             'Amazon EKS, section "Train PyTorch models using Torch Distributed Elastic"')
DL1 = ('AWS Machine Learning Blog, "Accelerate PyTorch with DeepSpeed to train large language '
       'models with Intel Habana Gaudi-based DL1 EC2 instances"')


@dataclass
class ArticleValue:
    job: str  # the number of the job's section in docs/seed-jobs.md
    article: str
    quote: str  # the article's words
    kind: str  # env, export, flag, ranks, per_node, nodes, mpirun, efa, fabric
    name: str  # the variable, flag or option ("" where the kind says it all)
    value: str  # the article's value
    relation: str  # kept, replaced, yours
    ours: str | None = None  # for "replaced": what the plan sets instead (None: unset)


ARTICLE_VALUES = [
    ArticleValue("1", P3DN_EFA, "mpirun -n 16 -N 8 --hostfile hosts", "ranks", "", "16", "kept"),
    ArticleValue("1", P3DN_EFA, "mpirun -n 16 -N 8 --hostfile hosts", "per_node", "", "8", "kept"),
    ArticleValue("1", P3DN_EFA, "-x NCCL_SOCKET_IFNAME=eth0", "env", "NCCL_SOCKET_IFNAME", "eth0",
                 "kept"),
    ArticleValue("1", P3DN_EFA, '-x FI_PROVIDER="efa"', "env", "FI_PROVIDER", "efa", "replaced"),
    ArticleValue("1", P3DN_EFA, "-x FI_EFA_TX_MIN_CREDITS=64", "env", "FI_EFA_TX_MIN_CREDITS", "64",
                 "replaced"),
    ArticleValue("1", P3DN_EFA, "-x NCCL_DEBUG=INFO", "env", "NCCL_DEBUG", "INFO", "yours"),
    ArticleValue("1", P3DN_EFA, "-x LD_LIBRARY_PATH", "export", "LD_LIBRARY_PATH", "", "kept"),
    ArticleValue("1", P3DN_EFA, "--mca btl_tcp_if_exclude lo,docker0", "env",
                 "OMPI_MCA_btl_tcp_if_exclude", "lo,docker0", "replaced"),
    ArticleValue("1", P3DN_EFA, "the full path to the EFA supported installation as: "
                 "/opt/amazon/openmpi/bin/mpirun", "mpirun", "", "/opt/amazon/openmpi/bin/mpirun",
                 "kept"),
    ArticleValue("2", EKS, "resource vpc.amazonaws.com are set to 4", "efa", "", "4", "kept"),
    ArticleValue("2", EKS, "NET/OFI Selected Provider is efa", "fabric", "", "efa", "kept"),
    ArticleValue("2", EKS, "nranks 16", "ranks", "", "16", "kept"),
    ArticleValue("3", BATCH_FSX, "--allow-run-as-root", "flag", "--allow-run-as-root", "", "kept"),
    ArticleValue("3", BATCH_FSX, "20 x p3.16xlarge = 160", "ranks", "", "160", "kept"),
    ArticleValue("3", BATCH_FSX, "-mca plm_rsh_no_tree_spawn 1", "env",
                 "OMPI_MCA_plm_rsh_no_tree_spawn", "1", "kept"),
    ArticleValue("3", BATCH_FSX, "-bind-to socket", "flag", "--bind-to", "socket", "replaced",
                 "none"),
    ArticleValue("3", BATCH_FSX, "-map-by slot", "flag", "--map-by", "slot", "kept"),
    ArticleValue("3", BATCH_FSX, "-mca pml ob1", "env", "OMPI_MCA_pml", "ob1", "kept"),
    ArticleValue("3", BATCH_FSX, "-mca btl ^openib", "env", "OMPI_MCA_btl", "^openib", "kept"),
    ArticleValue("3", BATCH_FSX, "export INTERFACE=eth0 ... -x NCCL_SOCKET_IFNAME=$INTERFACE", "env",
                 "NCCL_SOCKET_IFNAME", "eth0", "kept"),
    ArticleValue("3", BATCH_FSX, "export INTERFACE=eth0 ... -mca btl_tcp_if_include $INTERFACE",
                 "env", "OMPI_MCA_btl_tcp_if_include", "eth0", "kept"),
    ArticleValue("3", BATCH_FSX, "-x LD_LIBRARY_PATH -x PATH", "export", "PATH", "", "kept"),
    ArticleValue("3", BATCH_FSX, "-x TF_CPP_MIN_LOG_LEVEL=0", "env", "TF_CPP_MIN_LOG_LEVEL", "0",
                 "yours"),
    ArticleValue("4", P3_TCP, "mpirun -n 16 -N 8 --hostfile hosts", "ranks", "", "16", "kept"),
    ArticleValue("4", P3_TCP, "mpirun -n 16 -N 8 --hostfile hosts", "per_node", "", "8", "kept"),
    ArticleValue("4", P3_TCP, "-x NCCL_SOCKET_IFNAME=eth0", "env", "NCCL_SOCKET_IFNAME", "eth0",
                 "kept"),
    ArticleValue("4", P3_TCP, "-x NCCL_NSOCKS_PERTHREAD=4", "env", "NCCL_NSOCKS_PERTHREAD", "4",
                 "replaced"),
    ArticleValue("4", P3_TCP, "-x NCCL_SOCKET_NTHREADS=4", "env", "NCCL_SOCKET_NTHREADS", "4",
                 "replaced"),
    ArticleValue("5", DLAMI_BERT, "export FI_PROVIDER=efa", "env", "FI_PROVIDER", "efa",
                 "replaced"),
    ArticleValue("5", P3DN_FAIRSEQ, 'export FI_PROVIDER="efa";', "env", "FI_PROVIDER", "efa",
                 "replaced"),
    ArticleValue("5", P3DN_FAIRSEQ, "from 0 to 7 in case of 8 GPUs per mac[hine]", "per_node", "",
                 "8", "kept"),
    ArticleValue("6", DL1, "128 accelerators (16 dl1.24xlarge instances)", "ranks", "", "128",
                 "kept"),
    ArticleValue("6", DL1, "Each dl1.24xlarge instance has eight Habana Gaudi accelerators",
                 "per_node", "", "eight", "kept"),
    ArticleValue("6", DL1, "used four AWS Elastic Fabric Adapters (EFA)", "efa", "", "four",
                 "kept"),
    ArticleValue("7", EKS_TRAIN, "we set this to 3 because we had three p4d.24xlarge nodes",
                 "nodes", "", "3", "kept"),
    ArticleValue("7", EKS_TRAIN, "nproc_per_node under args should be set to the number of GPUs "
                 "per node, which in the case of p4d.24xlarge is 8", "per_node", "", "8", "kept"),
    ArticleValue("9", DLAMI_BERT, "export FI_PROVIDER=efa", "env", "FI_PROVIDER", "efa",
                 "replaced"),
]
WORDS = {"four": "4", "eight": "8"}


def _job(number: str) -> Job:
    return next(job for job in JOBS if job.title.startswith(number + ". "))


def plan_value(plan, row: ArticleValue) -> str | None:
    """What the plan does about the article's setting, in the article's terms."""
    argv = list(plan.argv or [])
    if row.kind == "env":
        return plan.environment.get(row.name)
    if row.kind == "export":
        exported = {argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "-x"}
        return "" if row.name in exported else None
    if row.kind == "flag":
        if row.name not in argv:
            return None
        following = argv[argv.index(row.name) + 1:argv.index(row.name) + 2]
        return following[0] if row.value and following else ""
    if row.kind == "ranks":
        if "-np" in argv:
            return argv[argv.index("-np") + 1]
        return str(plan.slots["count"] * int(_job(row.job).args[_job(row.job).args.index(
            "--nodes") + 1]))
    simple = {"per_node": str(plan.slots["count"]), "mpirun": argv[0] if argv else None,
              "efa": str(len(plan.facts["efa_devices"])), "fabric": plan.fabric["kind"],
              "nodes": next((a.split(":")[0] for a in argv[argv.index("--nnodes") + 1:][:1]), None)
              if "--nnodes" in argv else None}
    return simple[row.kind]


@pytest.mark.parametrize("row", ARTICLE_VALUES,
                         ids=[f"{r.job}-{r.kind}-{r.name or r.value}" for r in ARTICLE_VALUES])
def test_the_plan_against_the_articles_own_values(row):
    value = WORDS.get(row.value, row.value)
    assert row.value in row.quote, f"{row.value!r} is not in the quote {row.quote!r}"
    actual = plan_value(run_explain(_job(row.job).args), row)
    if row.relation == "kept":
        kept = actual == value or (row.kind == "env" and value in (actual or "").split(","))
        assert kept, f"{row.article}: {row.quote!r}: the plan has {actual!r}"
    elif row.relation == "replaced":
        assert actual == row.ours, (
            f"{row.article}: {row.quote!r}: the plan has {actual!r}, expected {row.ours!r}")
    else:
        assert row.relation == "yours", row.relation
        assert actual is None, f"{row.article}: {row.quote!r}: the plan sets {actual!r}"


def test_every_seed_job_has_article_values():
    """Each job of the doc whose article states values for it is checked against them (job 8,
    the MPI operator's launcher, has the same article values as job 2)."""
    numbers = {row.job for row in ARTICLE_VALUES}
    assert numbers == {job.title.split(".")[0] for job in JOBS} - {"8"}, numbers


def test_an_article_row_can_fail():
    """A kept value the plan does not set, a replacement the plan does not make, a setting the
    plan takes from the job: each is reported."""
    from dataclasses import replace

    kept = ARTICLE_VALUES[2]  # job 1: NCCL_SOCKET_IFNAME=eth0, kept
    for wrong in (replace(kept, value="eth1", quote="-x NCCL_SOCKET_IFNAME=eth1"),
                  replace(kept, relation="replaced", ours="=eth0"),
                  replace(kept, relation="yours")):
        with pytest.raises(AssertionError):
            test_the_plan_against_the_articles_own_values(wrong)
