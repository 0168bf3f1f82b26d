"""Checks the house rules a reader relies on, in the package's own source:

* module size: at most 400 lines in ``sync/`` and ``pipelines/``, 600 in ``benchmarks/``;
* constructors: no ``__init__`` written with more than 5 parameters besides ``self``
  (dataclasses are records of settings and exempt; so are the constructors listed in
  ``EXEMPT``, each with its reason);
* names: no two modules of one package whose names differ only by an ending (``train`` and
  ``trainer``, ``faults`` and ``fault_domain``): a module's name says what it holds.

Prints every violation and exits 1 if there is one; prints the line count of every module
with ``--sizes``. Run: ``python scripts/check_structure.py`` (``tests/test_structure.py``
runs it in CI).
"""

from __future__ import annotations

import argparse
import ast
import itertools
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMITS = {"sync": 400, "pipelines": 400, "benchmarks": 600}
MAX_PARAMETERS = 5
EXEMPT = {
    # A model's constructor is its architecture, as TorchRec's own models take it
    # (torchrec.models.dlrm.DLRM_DCN takes these seven).
    "models/dlrm.py:DLRM_DCN": "mirrors torchrec.models.dlrm.DLRM_DCN",
    "models/dcn.py:DCN": "the architecture's hyper-parameters, read from model.*",
    "models/autoint.py:AutoInt": "the architecture's hyper-parameters, read from model.*",
    # A data set's constructor is its data.options section, one keyword per documented option.
    "datasets/criteo_tsv.py:CriteoTSV": "its data.options, one keyword each",
    "datasets/criteo_npy.py:CriteoNpy": "its data.options, one keyword each",
    "datasets/synthetic.py:SyntheticCriteo": "its data.options, one keyword each",
}
_ENDINGS = ("s", "er", "or", "ion", "ing")


def modules() -> list[Path]:
    """The package's tracked Python files (tests and scripts are not the package)."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard",
                             "*.py"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.split()
    return [ROOT / p for p in listed if not p.startswith(("tests/", "scripts/", "docker/"))]


def _stem(word: str) -> str:
    for ending in _ENDINGS:
        if word.endswith(ending) and len(word) - len(ending) >= 4:
            return word[: -len(ending)]
    return word


def _is_dataclass(node: ast.ClassDef) -> bool:
    return any("dataclass" in ast.unparse(d) for d in node.decorator_list)


def constructors(path: Path) -> list[tuple[str, int]]:
    """Every class in ``path`` whose written ``__init__`` takes more than the limit, with the
    count."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ClassDef) or _is_dataclass(node):
            continue
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                a = item.args
                count = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) - 1
                if count > MAX_PARAMETERS:
                    out.append((node.name, count))
    return out


def twins(paths: list[Path]) -> list[tuple[str, str]]:
    """Pairs of modules of one package where one's name, less an ending, is the other's or
    the other's first word (``faults``, ``fault_domain``)."""
    by_package: dict[Path, list[str]] = {}
    for p in paths:
        by_package.setdefault(p.parent, []).append(p.stem)
    out = []
    for folder, names in by_package.items():
        for a, b in itertools.combinations(sorted(n for n in names if n != "__init__"), 2):
            whole = {_stem(a), _stem(b)}
            first = {_stem(a.split("_")[0]), _stem(b.split("_")[0])}
            if len(whole) == 1 or (len(first) == 1 and (_stem(a) in first or _stem(b) in first)):
                rel = folder.relative_to(ROOT)
                out.append((str(rel / f"{a}.py"), str(rel / f"{b}.py")))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", action="store_true", help="print every module's lines")
    args = parser.parse_args(argv)
    paths = modules()
    problems = []
    for p in paths:
        rel = p.relative_to(ROOT)
        lines = len(p.read_text().splitlines())
        limit = LIMITS.get(rel.parts[0]) if len(rel.parts) > 1 else None
        if args.sizes:
            print(f"{lines:6d} {rel}")
        if limit is not None and lines > limit:
            problems.append(f"{rel}: {lines} lines, over {rel.parts[0]}/'s {limit}")
        for name, count in constructors(p):
            if f"{rel}:{name}" not in EXEMPT:
                problems.append(f"{rel}: {name}.__init__ takes {count} parameters, over "
                                f"{MAX_PARAMETERS}")
    problems += [f"{a} and {b}: names that differ only by an ending" for a, b in twins(paths)]
    for line in problems:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
