"""Synchronization strategies for dense replicas: pure tensor math on one flat buffer.

A strategy turns one round of communication into a *delta* that the training loop adds to its
live replica. It never touches threads or process groups: the runner (:mod:`.runner`) flattens the
dense parameters into a snapshot, SUM-allreduces whatever :meth:`SyncStrategy.reduce_input`
returns, and hands the reduced buffer back to :meth:`SyncStrategy.delta`. That split is what lets
one strategy serve both the background ShadowSync runner (Zheng et al., "ShadowSync: Performing
Synchronization in the Background for Highly Scalable Distributed Training", arXiv:2003.03477)
and the blocking fixed-rate baselines of the same paper.

Why a delta and not a target: in ShadowSync the live replica keeps training while the round is in
flight, so by the time the result arrives it has moved on from the snapshot. Adding
``delta = target(snapshot) - snapshot`` applies the synchronization's correction and keeps that
local progress; overwriting with the target would throw it away.

Every operation runs in the buffer's dtype and on its device, with Python scalars as the only
hyper-parameters, so nothing here forces a host synchronization on CUDA.

Fewer bytes a round (``wire_dtype``): every strategy can send its payload in bfloat16 or float16
instead of the parameters' dtype, halving what crosses the network, or as int8 blocks, a quarter
(the wire quantizes float32 payloads and feeds back what it drops: :mod:`.quantized`). What is
sent must be small and centred for that to lose little, so each payload is a *difference to a
reference that is bit-identical on every rank*: EASGD's ``alpha (x - center)`` and BMUF's
``global - x`` already are, and model averaging then keeps a reference model ``ref`` (the last
average) and sends ``x - ref``. Every rank's state moves only by the reduced (quantized) buffer,
so references stay identical across ranks, and each round pulls replicas to the new reference
exactly, so the rounding error of one round does not accumulate into the next. The final
consensus always runs in full precision.
"""

from __future__ import annotations

import abc
from typing import Any

import torch
from torch import Tensor

from shadowsync.sync.config import BMUFConfig, EASGDConfig, SyncConfig, check

__all__ = [
    "WIRE_DTYPES",
    "BlockwiseModelUpdateFiltering",
    "ElasticAveraging",
    "ModelAveraging",
    "SyncStrategy",
    "make_strategy",
]

WIRE_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int8)


class SyncStrategy(abc.ABC):
    """One synchronization algorithm over a flat 1-D buffer of dense parameters.

    Call order, identical on every rank:

    1. :meth:`init` once, after the initial broadcast (all replicas identical).
    2. Per round: ``reduced = allreduce_sum(reduce_input(snapshot))`` then
       ``live += delta(snapshot, reduced)``.
    3. Optionally, to end with bit-identical replicas:
       ``live[:] = consensus(allreduce_sum(consensus_input(live)))``.

    Any state a strategy keeps (EASGD's center, BMUF's global model and momentum) is computed only
    from reduced buffers, so it stays bit-identical across ranks without being communicated.
    """

    def __init__(self, wire_dtype: torch.dtype | None = None) -> None:
        if wire_dtype is not None and wire_dtype not in WIRE_DTYPES:
            raise ValueError(f"wire_dtype must be one of {list(WIRE_DTYPES)} or None, "
                             f"got {wire_dtype}")
        self.wire_dtype = wire_dtype
        self._numel: int | None = None
        self._dtype = torch.float32
        self._world_size = 0
        self.rounds = 0

    @classmethod
    def from_config(cls, options: Any, wire_dtype: torch.dtype | None) -> SyncStrategy:
        """The strategy with ``sync.strategy``'s options and ``sync.transport.wire_dtype``.

        A strategy of one's own with options annotates ``options`` with a dataclass of them:
        ``sync.strategy.options`` is read into it and checked (see
        :class:`~.config.CustomStrategyConfig`)."""
        del options
        return cls(wire_dtype=wire_dtype)

    def init(self, params: Tensor, world_size: int) -> None:
        """Bind the strategy to the flat parameters of an already-identical set of replicas.

        Args:
            params: 1-D floating-point buffer of this rank's dense parameters. Only read: state
                derived from it is copied.
            world_size: number of replicas taking part in each allreduce.
        """
        if not isinstance(params, Tensor) or params.dim() != 1:
            raise ValueError(f"params must be a 1-D tensor, got {type(params).__name__} "
                             f"of shape {getattr(params, 'shape', None)}")
        if not params.is_floating_point():
            raise ValueError(f"params must be floating point, got {params.dtype}")
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        self._numel = params.numel()
        self._dtype = params.dtype
        self._world_size = world_size
        self.rounds = 0
        self._init_state(params)

    @abc.abstractmethod
    def _init_state(self, params: Tensor) -> None:
        """Create the strategy's state from the (identical) initial replica."""

    @property
    def compressed(self) -> bool:
        """Whether payloads travel in a narrower dtype than the parameters."""
        return self.wire_dtype is not None and self.wire_dtype != self._dtype

    def _to_wire(self, t: Tensor) -> Tensor:
        """``t`` as it goes into the round's buffer: a rounded copy in a narrower float dtype,
        else ``t`` itself (an int8 wire quantizes float32 payloads as they travel)."""
        wire = self.wire_dtype
        return t.to(wire) if self.compressed and wire is not None and wire.is_floating_point else t

    def _from_wire(self, t: Tensor) -> Tensor:
        """A reduced buffer back in the parameters' dtype (a copy when compressed)."""
        return t.to(self._dtype) if t.dtype != self._dtype else t

    @abc.abstractmethod
    def reduce_input(self, snapshot: Tensor) -> Tensor:
        """The buffer this rank contributes to the round's SUM-allreduce, in ``wire_dtype``."""

    @abc.abstractmethod
    def delta(self, snapshot: Tensor, reduced: Tensor) -> Tensor:
        """Finish a round: update the state and return the correction to add to the live replica.

        Args:
            snapshot: the replica that :meth:`reduce_input` saw this round.
            reduced: the SUM over ranks of :meth:`reduce_input` (in ``wire_dtype``). Not kept:
                it may be reused.
        """

    def consensus_input(self, snapshot: Tensor) -> Tensor:
        """What to SUM-allreduce, in the parameters' dtype, for :meth:`consensus`; by default the
        replica itself."""
        self._check(snapshot, "snapshot")
        return snapshot

    def consensus(self, reduced: Tensor) -> Tensor:
        """The model every replica adopts when training ends; by default the replicas' average.

        Computed from ``reduced`` alone, so every rank gets the same bits; the caller overwrites
        the live replica with it (adding a delta would round differently on each rank).
        """
        self._check(reduced, "reduced")
        return reduced / self._world_size

    def _tensors(self) -> dict[str, Tensor]:
        """The strategy's tensor state by name (live references); empty when stateless."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Round counter plus cloned tensor state."""
        self._require_init()
        return {"rounds": self.rounds, **{k: t.clone() for k, t in self._tensors().items()}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output; must follow :meth:`init` (it fixes shape/device)."""
        self._require_init()
        tensors = self._tensors()
        expected = {"rounds", *tensors}
        if set(state_dict) != expected:
            raise KeyError(f"{type(self).__name__} state_dict keys {sorted(state_dict)} "
                           f"!= expected {sorted(expected)}")
        for name, dst in tensors.items():
            src = state_dict[name]
            if src.shape != dst.shape:
                raise ValueError(f"{name}: shape {tuple(src.shape)} != {tuple(dst.shape)}")
            dst.copy_(src)
        self.rounds = int(state_dict["rounds"])

    def _require_init(self) -> None:
        if self._numel is None:
            raise RuntimeError(f"{type(self).__name__}.init() has not been called")

    def _check(self, t: Tensor, name: str) -> None:
        self._require_init()
        if t.shape != (self._numel,):
            raise ValueError(f"{name} must have shape ({self._numel},), got {tuple(t.shape)}")


class ModelAveraging(SyncStrategy):
    """Model averaging (MA): every round pulls each replica to the replicas' mean.

    ``target = sum_k x_k / W``; ``delta = target - x``. This is the averaging used by the
    ShadowSync paper's S-MA / FR-MA (arXiv:2003.03477, Sec. 3) and by local SGD
    (Lin et al., "Don't Use Large Mini-Batches, Use Local SGD", arXiv:1808.07217).

    With a narrower ``wire_dtype`` it keeps a reference ``ref`` (identical on every rank, the
    previous round's target) and sends ``q_k = wire(x_k - ref)``::

        ref   <- ref + sum_k q_k / W
        delta_k = ref - x_k

    Stateless (beyond the round counter) otherwise.
    """

    def __init__(self, wire_dtype: torch.dtype | None = None) -> None:
        super().__init__(wire_dtype)
        self.reference = torch.empty(0)

    def _init_state(self, params: Tensor) -> None:
        self.reference = params.detach().clone() if self.compressed else torch.empty(0)

    def _tensors(self) -> dict[str, Tensor]:
        return {"reference": self.reference} if self.compressed else {}

    def reduce_input(self, snapshot: Tensor) -> Tensor:
        self._check(snapshot, "snapshot")
        return self._to_wire(snapshot - self.reference) if self.compressed else snapshot

    def delta(self, snapshot: Tensor, reduced: Tensor) -> Tensor:
        self._check(snapshot, "snapshot")
        self._check(reduced, "reduced")
        self.rounds += 1
        if not self.compressed:
            return reduced.div(self._world_size).sub_(snapshot)
        self.reference.add_(self._from_wire(reduced).div_(self._world_size))
        return self.reference - snapshot

    def consensus(self, reduced: Tensor) -> Tensor:
        average = super().consensus(reduced)
        if self.compressed:
            self.reference.copy_(average)
        return average


class ElasticAveraging(SyncStrategy):
    """Elastic averaging SGD (EASGD), synchronous form, as one allreduce per round.

    Zhang, Choromanska, LeCun, "Deep learning with Elastic Averaging SGD", NeurIPS 2015
    (arXiv:1412.6651), Eq. 5-6: each worker and a center variable ``c`` attract each other with
    strength ``alpha``::

        d_k = alpha * (x_k - c)
        x_k <- x_k - d_k                  (delta = -d_k)
        c   <- c + sum_k d_k              (the allreduce)

    The center lives on every rank instead of a parameter server; it only ever changes by the
    reduced sum, so it is bit-identical everywhere. The center moves by ``beta = W * alpha``
    of its distance to the replicas' mean each round (the paper's moving rate, Sec. 3), so
    ``W * alpha > 1`` overshoots the mean and the replicas follow it apart (a run at W = 4 and
    alpha 0.5 went non-finite); :meth:`init` refuses it, naming the largest alpha that fits.

    Consensus (end of training) sets every replica *and* the center to the replicas' average,
    rather than to the center: the center lags the workers by design (it is a moving average of
    them), and the average is what the other strategies end on too.
    """

    def __init__(self, alpha: float, wire_dtype: torch.dtype | None = None) -> None:
        super().__init__(wire_dtype)
        check("alpha", alpha)
        self.alpha = alpha
        self.center = torch.empty(0)

    @classmethod
    def from_config(cls, options: EASGDConfig, wire_dtype: torch.dtype | None) -> ElasticAveraging:
        return cls(alpha=options.alpha, wire_dtype=wire_dtype)

    def _init_state(self, params: Tensor) -> None:
        if self.alpha * self._world_size > 1:
            raise ValueError(
                f"alpha {self.alpha} with {self._world_size} replicas moves EASGD's center by "
                f"beta = replicas * alpha = {self.alpha * self._world_size:g} of its distance "
                f"to their mean each round, past it (beta must be <= 1; Zhang et al. 2015 use "
                f"0.9): set sync.strategy.alpha <= {1 / self._world_size:.4g}, e.g. "
                f"{0.9 / self._world_size:.4g}")
        self.center = params.detach().clone()

    def _tensors(self) -> dict[str, Tensor]:
        return {"center": self.center}

    def _elastic_difference(self, snapshot: Tensor) -> Tensor:
        """``d_k`` as sent (rounded to the wire dtype when compressed)."""
        return self._to_wire((snapshot - self.center).mul_(self.alpha))

    def reduce_input(self, snapshot: Tensor) -> Tensor:
        self._check(snapshot, "snapshot")
        return self._elastic_difference(snapshot)

    def delta(self, snapshot: Tensor, reduced: Tensor) -> Tensor:
        self._check(snapshot, "snapshot")
        self._check(reduced, "reduced")
        # Recomputed from the same operands as reduce_input, so bit-identical to what was sent:
        # the replica gives up exactly what it contributed to the center (on an int8 wire, what
        # the round's error feedback carries until the center has it).
        step = self._from_wire(self._elastic_difference(snapshot)).neg_()
        self.center.add_(self._from_wire(reduced))
        self.rounds += 1
        return step

    def consensus(self, reduced: Tensor) -> Tensor:
        average = super().consensus(reduced)
        self.center.copy_(average)
        return average


class BlockwiseModelUpdateFiltering(SyncStrategy):
    """Blockwise model-update filtering (BMUF), with classical or Nesterov block momentum.

    Chen & Huo, "Scalable training of deep learning machines by incremental block training with
    intra-block parallel optimization and blockwise model-update filtering", ICASSP 2016
    (doi:10.1109/ICASSP.2016.7472805). The update follows fairseq's ``fairseq/optim/bmuf.py``
    (its block-momentum step before and after the sync), with the global model ``g`` kept on
    every rank::

        grad = g - mean_k x_k             (the allreduce carries g - x_k, like fairseq)
        m    = block_momentum * m + block_lr * grad
        g    = g - m
        g    = g - block_momentum * m     (Nesterov only: fairseq's ``use_nbm``)
        delta_k = g - x_k

    As in fairseq, with Nesterov the stored global model includes the look-ahead step.
    ``block_momentum`` defaults to ``1 - 1/W`` (Chen & Huo's recommendation), resolved in
    :meth:`init`; ``block_momentum = 0, block_lr = 1`` reduces to model averaging.

    Consensus (end of training) runs one more BMUF round on the current replicas and makes every
    replica the resulting global model: it is computed from the reduced buffer alone, so it is
    identical everywhere, and it is the model BMUF itself would hand out.
    """

    def __init__(
        self,
        block_momentum: float | None = None,
        block_lr: float = 1.0,
        nesterov: bool = False,
        wire_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(wire_dtype)
        check("block_momentum", block_momentum)
        check("block_lr", block_lr)
        self._requested_block_momentum = block_momentum
        self.block_momentum = 0.0
        self.block_lr = block_lr
        self.nesterov = nesterov
        self.global_model = torch.empty(0)
        self.momentum = torch.empty(0)

    @classmethod
    def from_config(cls, options: BMUFConfig,
                    wire_dtype: torch.dtype | None) -> BlockwiseModelUpdateFiltering:
        return cls(block_momentum=options.block_momentum, block_lr=options.block_lr,
                   nesterov=options.nesterov, wire_dtype=wire_dtype)

    def _init_state(self, params: Tensor) -> None:
        requested = self._requested_block_momentum
        self.block_momentum = 1.0 - 1.0 / self._world_size if requested is None else requested
        self.global_model = params.detach().clone()
        self.momentum = torch.zeros_like(self.global_model)

    def _tensors(self) -> dict[str, Tensor]:
        return {"global_model": self.global_model, "momentum": self.momentum}

    def reduce_input(self, snapshot: Tensor) -> Tensor:
        self._check(snapshot, "snapshot")
        return self._to_wire(self.global_model - snapshot)

    def consensus_input(self, snapshot: Tensor) -> Tensor:
        self._check(snapshot, "snapshot")
        return self.global_model - snapshot

    def _advance(self, reduced: Tensor) -> Tensor:
        """One block-momentum update of the global model; returns it (a live reference)."""
        self._check(reduced, "reduced")
        grad = self._from_wire(reduced).div(self._world_size)
        self.momentum.mul_(self.block_momentum).add_(grad, alpha=self.block_lr)
        self.global_model.sub_(self.momentum)
        if self.nesterov:
            self.global_model.sub_(self.momentum, alpha=self.block_momentum)
        return self.global_model

    def delta(self, snapshot: Tensor, reduced: Tensor) -> Tensor:
        self._check(snapshot, "snapshot")
        self.rounds += 1
        return self._advance(reduced) - snapshot

    def consensus(self, reduced: Tensor) -> Tensor:
        return self._advance(reduced).clone()


def make_strategy(cfg: SyncConfig) -> SyncStrategy:
    """The ShadowSync strategy ``sync.strategy`` names, with its options and the wire dtype."""
    if not cfg.algorithm.strategy:
        raise ValueError(f"sync.strategy.name: {cfg.strategy.name!r} is not a ShadowSync "
                         "strategy")
    strategy: SyncStrategy = cfg.algorithm.load().from_config(
        cfg.strategy.strategy_options(), getattr(torch, cfg.transport.wire_dtype))
    return strategy
