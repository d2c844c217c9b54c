"""What validating one bill of materials costs: the validator process as the project runs it
(``matrix.image.sbom.VALIDATE``: ``IRI_PARSER``, rfc3987-syntax's one parser that jsonschema's
IRI checks use, then ``CHECK``), and, alternately, ``CHECK`` alone (jsonschema and
cyclonedx-python-lib imported as they come, rfc3987-syntax building its 38 Earley parsers at
import).

Both validate the same document, the SBOM of ``cuda10.1-tcp`` (components built from source, so
IRI references to check), and must give the same answer. CPU seconds of the child process
(``RUSAGE_CHILDREN``), so the machine's load weighs less than on the wall clock; medians of
``--runs`` each and their ratio are printed. ``invoke sbom`` and every ``invoke push`` validate
once; the suite does about 16 times a run.

Usage: ``python bench/sbom_validate.py [--runs N]``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from alternate import alternate, child_cpu

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from matrix.image import sbom  # noqa: E402
from matrix.model.loader import load_matrix  # noqa: E402

# The baseline: the validation without the one-parser module provided first.
PLAIN = sbom.CHECK


def validator_cpu(script: str, text: str) -> tuple[float, str]:
    """CPU seconds of one validator process running ``script`` on ``text``, and its answer."""
    used, proc = child_cpu([sys.executable, "-c", script], input=text, capture_output=True,
                           text=True)
    return used, proc.stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    matrix = load_matrix(ROOT / "stacks.yaml")
    stack = matrix.stack("cuda10.1-tcp")
    text = sbom.document(matrix, stack, "mnp-stacks:cuda10.1-tcp", "sha256:" + "0" * 64, [], [])
    broken = text.replace('"url": "https://', '"url": "https://example.org/a b#', 1)
    for document in (text, broken):  # the same answer from both, valid and not
        answers = {validator_cpu(script, document)[1] for script in (sbom.VALIDATE, PLAIN)}
        if len(answers) != 1:
            print(f"the two validators disagree: {sorted(answers)}", file=sys.stderr)
            return 1
    project_s, baseline_s = alternate(args.runs, lambda: validator_cpu(sbom.VALIDATE, text)[0],
                                      lambda: validator_cpu(PLAIN, text)[0])
    print(f"one SBOM validation: {project_s:.2f} s of CPU (median of {args.runs}); with "
          f"rfc3987-syntax imported as it comes: {baseline_s:.2f} s; ratio "
          f"{baseline_s / project_s:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
