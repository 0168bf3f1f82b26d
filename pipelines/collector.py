"""Python's garbage collector, run at the same steps on every rank while training.

Python collects cyclic garbage whenever allocations cross a threshold: at its own moment on
each rank, and now and then with a full collection that walks every tracked object (a
TorchRec model, its plan and its data set are many: such a pause can last several training
steps). While one rank collects, its peers wait for it in the next all-to-all, so every rank
pays every rank's pauses, at random steps. As
torchtitan's ``GarbageCollection`` does ("used to avoid stragglers in garbage collection";
torchtitan is not a dependency, so this is written here), automatic collection is off while
training and the young generations are collected every ``every_steps`` steps, at the same
step on every rank; everything is collected when training starts and after each evaluation
(which every rank runs together), so that cyclic garbage that outlived two young collections
cannot pile up over a long run.
"""

from __future__ import annotations

import gc
from types import TracebackType


class StepCollector:
    """Collects garbage at step boundaries; a context for the whole of training.

    Args:
        every_steps: steps between collections of the young generations (``gc.collect(1)``);
            None leaves Python's automatic collector as it is and makes every call a no-op.

    Example::

        with StepCollector(cfg.train.gc_every_steps) as collector:
            for step in range(1, steps + 1):
                train_step()
                collector.after_step(step)
    """

    def __init__(self, every_steps: int | None) -> None:
        if every_steps is not None and every_steps <= 0:
            raise ValueError(f"every_steps must be positive or None, got {every_steps}")
        self.every_steps = every_steps
        self._was_enabled = True  # what __enter__ found, restored on exit

    def __enter__(self) -> StepCollector:
        if self.every_steps is not None:
            self._was_enabled = gc.isenabled()
            gc.disable()
            self.collect_all()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.every_steps is not None and self._was_enabled:
            gc.enable()

    def after_step(self, step: int) -> None:
        """Collects the young generations if ``step`` is a multiple of ``every_steps``."""
        if self.every_steps is not None and step % self.every_steps == 0:
            gc.collect(1)

    def collect_all(self) -> None:
        """A full collection, at a point every rank reaches together (no-op when off)."""
        if self.every_steps is not None:
            gc.collect()
