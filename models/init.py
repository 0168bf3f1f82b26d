"""Initialization that survives building on ``meta``.

``DistributedModelParallel`` materializes a model built on ``meta`` module by module: every
parameter becomes ``torch.empty_like`` (whatever memory held) and the module's
``reset_parameters()`` is called, if it has one. A module that holds parameters and has no
``reset_parameters()`` (``torch.nn.ParameterList`` is one) keeps garbage, silently, and a buffer
on ``meta`` becomes zeros. :func:`require_initializable` turns both into an error at build time,
naming the module; :func:`reset_dense_from_seed_` initializes a model's dense part from a seed
alone, independent of what the global RNG served before (the embedding tables draw from it in
amounts that depend on the sharding plan).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

import torch
from torch import nn
from torchrec.distributed.types import ShardedModule
from torchrec.modules.embedding_modules import (
    EmbeddingBagCollectionInterface,
    EmbeddingCollectionInterface,
)

__all__ = ["NotInitializable", "dense_roots", "is_sparse", "require_initializable",
           "reset_dense_from_seed_", "reset_from_seed_", "uninitializable_modules"]

_SPARSE = (EmbeddingBagCollectionInterface, EmbeddingCollectionInterface, ShardedModule)


class NotInitializable(TypeError):
    """A module built on ``meta`` holds parameters and has no ``reset_parameters()``."""


def _own_parameters(module: nn.Module) -> list[nn.Parameter]:
    """The parameters ``module`` holds itself (not its children's)."""
    return [p for p in module._parameters.values() if p is not None]


def uninitializable_modules(module: nn.Module) -> list[str]:
    """Names (with class, and why) of the modules under ``module`` that hold parameters on
    ``meta`` and have no ``reset_parameters()`` to initialize them after materialization, or
    hold a buffer on ``meta`` (materialized as zeros)."""
    bad = []
    for name, m in module.named_modules():
        where = f"{name or '<root>'} ({type(m).__name__})"
        if any(p.is_meta for p in _own_parameters(m)) \
                and not callable(getattr(m, "reset_parameters", None)):
            bad.append(f"{where}: holds parameters on meta but has no reset_parameters(), so "
                       "DistributedModelParallel would materialize them with torch.empty_like "
                       "and never initialize them; give the module a reset_parameters()")
        if any(b is not None and b.is_meta for b in m._buffers.values()):
            bad.append(f"{where}: holds a buffer on meta, which DistributedModelParallel "
                       "materializes as zeros; build the buffer on the CPU")
    return bad


def require_initializable(module: nn.Module) -> None:
    """Raises :class:`NotInitializable` naming every module that DistributedModelParallel
    would materialize from ``meta`` without initializing it."""
    bad = uninitializable_modules(module)
    if bad:
        raise NotInitializable("; ".join(bad))


def is_sparse(module: nn.Module) -> bool:
    """An embedding collection, sharded (after DistributedModelParallel) or not."""
    return isinstance(module, _SPARSE)


def dense_roots(model: nn.Module) -> list[nn.Module]:
    """The largest submodules of ``model`` that hold no embedding collection, in definition
    order: the dense part, whether ``model`` is sharded or not.

    Raises:
        NotInitializable: a module holds parameters of its own beside an embedding
            collection below it (they could not be initialized apart from the tables).
    """
    if is_sparse(model):
        return []
    if not any(is_sparse(m) for m in model.modules()):
        return [model]
    if _own_parameters(model):
        raise NotInitializable(f"{type(model).__name__} holds parameters beside embedding "
                               "tables; move them into a submodule")
    return [root for child in model.children() for root in dense_roots(child)]


def reset_dense_from_seed_(model: nn.Module, seed: int) -> None:
    """Initializes the dense part of ``model`` (:func:`dense_roots`) from ``seed`` alone
    (:func:`reset_from_seed_`); the embedding tables are left alone.

    The same values whether the model was built on CPU, on a GPU, or on ``meta`` and
    materialized by DistributedModelParallel, for any world size and sharding plan.

    Example::

        model = build_model(cfg, spec, torch.device("cpu")).model
        reset_dense_from_seed_(model, seed=0)
    """
    reset_from_seed_(dense_roots(model), seed)


def reset_from_seed_(modules: Iterable[nn.Module], seed: int) -> None:
    """Calls ``reset_parameters()`` on every module holding parameters under ``modules``, in
    order, drawing from a CPU generator seeded with ``seed``.

    The values depend on ``seed`` and the modules alone: not on the global RNG's state (which
    is left as it was), nor on the device (modules off the CPU are initialized on a CPU copy).
    """
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        for root in modules:
            for name, m in root.named_modules():
                own = _own_parameters(m)
                if not own:
                    continue
                if any(p.is_meta for p in own):
                    raise ValueError(f"{name} ({type(m).__name__}) is still on meta: "
                                     "materialize it before initializing")
                reset = getattr(m, "reset_parameters", None)
                if not callable(reset):
                    raise NotInitializable(f"{name} ({type(m).__name__}) holds parameters and "
                                           "has no reset_parameters()")
                if all(p.device.type == "cpu" for p in own):
                    reset()
                    continue
                on_cpu = copy.deepcopy(m).cpu()
                on_cpu.reset_parameters()
                for p, q in zip(own, _own_parameters(on_cpu), strict=True):
                    p.copy_(q)
