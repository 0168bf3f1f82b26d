"""The house rules of ``scripts/check_structure.py`` hold for the package, and the checks
themselves catch what they are for."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def _checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_structure",
                                                  REPO / "scripts" / "check_structure.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_package_keeps_its_module_sizes_constructors_and_names() -> None:
    assert _checker().main([]) == 0


def test_names_that_differ_only_by_an_ending_are_found(tmp_path: Path) -> None:
    checker = _checker()
    checker.ROOT = tmp_path
    names = ["train", "trainer", "faults", "fault_domain", "bench_loop", "bench_sync", "round",
             "runner", "checkpoint", "checkpointer"]
    paths = [tmp_path / "pkg" / f"{n}.py" for n in names]
    assert sorted(checker.twins(paths)) == [
        ("pkg/checkpoint.py", "pkg/checkpointer.py"), ("pkg/fault_domain.py", "pkg/faults.py"),
        ("pkg/train.py", "pkg/trainer.py")]


def test_a_constructor_over_five_parameters_is_found(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(textwrap.dedent("""
        import dataclasses

        class Wide:
            def __init__(self, a, b, c, d, e, *, f): ...

        class Narrow:
            def __init__(self, a, b, c, d, e): ...

        @dataclasses.dataclass
        class Record:
            a: int
    """))
    assert _checker().constructors(source) == [("Wide", 6)]
