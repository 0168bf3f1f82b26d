"""The model zoo's registry of architectures and their typed options, importable without torch
so that a run's config is checked (``torchx run`` at submit time) before torch and TorchRec load.

``model.name`` picks the architecture; the other keys of the ``model`` section are that
architecture's options (a dataclass here, so an unknown or mistyped key fails naming it). A name
of the form ``package.module:function`` is a user's own builder (:class:`CustomModelConfig`).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from shadowsync.registry import Registry, import_path
from shadowsync.sections import read_section

if TYPE_CHECKING:
    from torchrec.modules.embedding_configs import EmbeddingBagConfig


def _layers(key: str, sizes: list[int], *, ends_in: int | None = None,
            multiple_of: int | None = None, min_len: int = 1) -> None:
    """Checks one list of layer sizes, naming ``model.<key>`` in every error; ``ends_in`` is
    1 (a logit) or the embedding width."""
    if len(sizes) < min_len:
        raise ValueError(f"model.{key} needs at least {min_len} layer(s), got {sizes}")
    if any(s <= 0 for s in sizes):
        raise ValueError(f"model.{key}: layer sizes must be positive, got {sizes}")
    if ends_in is not None and sizes[-1] != ends_in:
        what = "1 (the logit)" if ends_in == 1 else f"model.embedding_dim ({ends_in})"
        raise ValueError(f"model.{key} must end in {what}, got {sizes}")
    if multiple_of is not None and sizes[-1] % multiple_of:
        raise ValueError(f"model.{key} must end in a multiple of model.embedding_dim "
                         f"({multiple_of}), got {sizes}")


def _positive(**values: int) -> None:
    for key, value in values.items():
        if value <= 0:
            raise ValueError(f"model.{key} must be positive, got {value}")


@dataclass
class ModelConfig:
    """What every architecture has: its ``name`` and the width of its embedding tables.

    Subclasses add the architecture's options and name the function that builds it
    (``builder``, an import path; see :func:`shadowsync.models.zoo.build_model` for what it
    receives and returns).
    """

    builder: ClassVar[str] = ""
    name: str = "dlrm"
    embedding_dim: int = 16

    def validate(self) -> None:
        """Raises ``ValueError`` naming the ``model.`` key of the first bad option."""
        _positive(embedding_dim=self.embedding_dim)

    def builder_path(self) -> str:
        """``package.module:function`` of the builder."""
        return self.builder

    def builder_options(self) -> Any:
        """What the builder receives as its options: this config, for the built-in models."""
        return self

    def embedding_bag_configs(
        self, sparse_names: list[str], num_embeddings: list[int]
    ) -> list[EmbeddingBagConfig]:
        """One table per sparse feature, named ``t_<feature>``, ``embedding_dim`` wide."""
        from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType

        if len(sparse_names) != len(num_embeddings):
            raise ValueError("one table size per sparse feature is needed")
        for name, n in zip(sparse_names, num_embeddings, strict=True):
            if n <= 0:
                raise ValueError(f"table size of sparse feature {name!r} must be positive, got {n}")
        return [
            EmbeddingBagConfig(
                name=f"t_{name}",
                embedding_dim=self.embedding_dim,
                num_embeddings=n,
                feature_names=[name],
                pooling=PoolingType.SUM,
            )
            for name, n in zip(sparse_names, num_embeddings, strict=True)
        ]

    @staticmethod
    def config_class(raw: dict[str, Any], key: str) -> type[ModelConfig]:
        """The options class that the ``name`` in the raw ``model`` section asks for
        (:func:`~shadowsync.sections.read_section` reads the section as that class)."""
        name = raw.get("name", ModelConfig.name)
        if not isinstance(name, str):
            raise ValueError(f"{key}.name: expected a string, got {name!r}")
        return MODELS.get(name)


@dataclass
class DLRMConfig(ModelConfig):
    """DLRM (``interaction: dot``, arXiv 1906.00091) or DLRM-DCNv2 (``interaction: dcn``,
    low-rank cross layers, arXiv 2008.13535).

    Args:
        dense_arch_layer_sizes: bottom MLP; its last layer must equal ``embedding_dim``.
        over_arch_layer_sizes: top MLP, ending in 1 logit.
        dcn_num_layers / dcn_low_rank_dim: cross layers, only with ``interaction=dcn``.
    """

    builder: ClassVar[str] = "shadowsync.models.dlrm:build_dlrm"
    interaction: Literal["dot", "dcn"] = "dot"
    dense_arch_layer_sizes: list[int] = field(default_factory=lambda: [64, 16])
    over_arch_layer_sizes: list[int] = field(default_factory=lambda: [64, 32, 1])
    dcn_num_layers: int = 2
    dcn_low_rank_dim: int = 8

    def validate(self) -> None:
        super().validate()
        if self.interaction not in ("dot", "dcn"):
            raise ValueError(f"model.interaction must be 'dot' or 'dcn', got {self.interaction!r}")
        _layers("dense_arch_layer_sizes", self.dense_arch_layer_sizes, ends_in=self.embedding_dim)
        _layers("over_arch_layer_sizes", self.over_arch_layer_sizes, ends_in=1, min_len=2)
        if self.interaction == "dcn":
            _positive(dcn_num_layers=self.dcn_num_layers, dcn_low_rank_dim=self.dcn_low_rank_dim)


@dataclass
class DLRMProjectionConfig(ModelConfig):
    """DLRM whose dot interaction runs between two learned projections of the F+1 vectors
    (TorchRec's ``DLRM_Projection``; arXiv 1906.00091).

    Args:
        dense_arch_layer_sizes / over_arch_layer_sizes: as for ``dlrm``.
        interaction_branch1_layer_sizes / interaction_branch2_layer_sizes: the two projection
            MLPs; each ends in a multiple of ``embedding_dim`` (F1 and F2 vectors).
    """

    builder: ClassVar[str] = "shadowsync.models.dlrm:build_dlrm_projection"
    name: str = "dlrm_projection"
    dense_arch_layer_sizes: list[int] = field(default_factory=lambda: [64, 16])
    over_arch_layer_sizes: list[int] = field(default_factory=lambda: [64, 32, 1])
    interaction_branch1_layer_sizes: list[int] = field(default_factory=lambda: [64, 64])
    interaction_branch2_layer_sizes: list[int] = field(default_factory=lambda: [64, 64])

    def validate(self) -> None:
        super().validate()
        _layers("dense_arch_layer_sizes", self.dense_arch_layer_sizes, ends_in=self.embedding_dim)
        _layers("over_arch_layer_sizes", self.over_arch_layer_sizes, ends_in=1, min_len=2)
        for key in ("interaction_branch1_layer_sizes", "interaction_branch2_layer_sizes"):
            _layers(key, getattr(self, key), multiple_of=self.embedding_dim)


@dataclass
class DeepFMConfig(ModelConfig):
    """DeepFM (Guo et al., arXiv 1703.04247), TorchRec's ``SimpleDeepFMNN`` with a logit out.

    Args:
        hidden_layer_size: hidden width of the dense features' MLP.
        deep_fm_dimension: output width of the deep component over all embeddings.
    """

    builder: ClassVar[str] = "shadowsync.models.deepfm:build_deepfm"
    name: str = "deepfm"
    hidden_layer_size: int = 64
    deep_fm_dimension: int = 32

    def validate(self) -> None:
        super().validate()
        _positive(hidden_layer_size=self.hidden_layer_size,
                  deep_fm_dimension=self.deep_fm_dimension)


@dataclass
class WideDeepConfig(ModelConfig):
    """Wide & Deep (Cheng et al., arXiv 1606.07792).

    Args:
        deep_layer_sizes: the deep MLP over the dense features and all embeddings (a linear
            layer to the logit follows).
    """

    builder: ClassVar[str] = "shadowsync.models.wide_deep:build_wide_deep"
    name: str = "wide_deep"
    deep_layer_sizes: list[int] = field(default_factory=lambda: [128, 64])

    def validate(self) -> None:
        super().validate()
        _layers("deep_layer_sizes", self.deep_layer_sizes)


@dataclass
class DCNConfig(ModelConfig):
    """DCNv2 on its own (Wang et al., arXiv 2008.13535): low-rank cross layers and a deep MLP
    over the dense features and all embeddings, ``stacked`` (cross, then deep) or ``parallel``.

    Args:
        structure: ``stacked`` or ``parallel``.
        num_layers / low_rank_dim: the cross layers.
        deep_layer_sizes: the deep MLP (a linear layer to the logit follows).
    """

    builder: ClassVar[str] = "shadowsync.models.dcn:build_dcn"
    name: str = "dcn"
    structure: Literal["stacked", "parallel"] = "stacked"
    num_layers: int = 3
    low_rank_dim: int = 16
    deep_layer_sizes: list[int] = field(default_factory=lambda: [128, 64])

    def validate(self) -> None:
        super().validate()
        _positive(num_layers=self.num_layers, low_rank_dim=self.low_rank_dim)
        _layers("deep_layer_sizes", self.deep_layer_sizes)


@dataclass
class AutoIntConfig(ModelConfig):
    """AutoInt (Song et al., arXiv 1810.11921): multi-head self-attention over the fields.

    Args:
        dense_arch_layer_sizes: MLP making the dense features one more field; ends in
            ``embedding_dim``.
        num_layers / num_heads: attention layers and heads per layer.
        attention_dim: each field's width after every attention layer (a multiple of
            ``num_heads``).
        over_arch_layer_sizes: top MLP over all attended fields, ending in 1.
    """

    builder: ClassVar[str] = "shadowsync.models.autoint:build_autoint"
    name: str = "autoint"
    dense_arch_layer_sizes: list[int] = field(default_factory=lambda: [64, 16])
    num_layers: int = 2
    num_heads: int = 2
    attention_dim: int = 16
    over_arch_layer_sizes: list[int] = field(default_factory=lambda: [64, 1])

    def validate(self) -> None:
        super().validate()
        _layers("dense_arch_layer_sizes", self.dense_arch_layer_sizes, ends_in=self.embedding_dim)
        _positive(num_layers=self.num_layers, num_heads=self.num_heads,
                  attention_dim=self.attention_dim)
        if self.attention_dim % self.num_heads:
            raise ValueError(f"model.attention_dim ({self.attention_dim}) must be a multiple of "
                             f"model.num_heads ({self.num_heads})")
        _layers("over_arch_layer_sizes", self.over_arch_layer_sizes, ends_in=1, min_len=2)


@dataclass
class CustomModelConfig(ModelConfig):
    """A user's own model: ``name`` is its builder's import path, ``package.module:function``.

    The builder gets the tables (``embedding_dim`` wide) and ``options``; when the builder's
    ``options`` parameter is annotated with a dataclass, ``options`` are read into it and
    checked like every other setting (errors name ``model.options.<key>``), else it gets the
    plain mapping. Validating imports the builder's module, so a wrong path fails before
    training.
    """

    options: dict[str, Any] = field(default_factory=dict)

    def builder_path(self) -> str:
        return self.name

    def builder_options(self) -> Any:
        builder = import_builder(self.name)
        try:
            options_class = typing.get_type_hints(builder).get("options")
        except (NameError, TypeError) as e:
            raise ValueError(f"model.name: the annotations of {self.name!r} do not resolve "
                             f"({type(e).__name__}: {e})") from e
        if not (isinstance(options_class, type) and dataclasses.is_dataclass(options_class)):
            return self.options
        return read_section(options_class, self.options, "model.options")

    def validate(self) -> None:
        super().validate()
        self.builder_options()


def import_builder(path: str) -> Callable[..., Any]:
    """The function at ``package.module:function`` (``ValueError`` naming ``model.name``)."""
    target = import_path(path, MODELS.key)
    if not callable(target):
        raise ValueError(f"model.name: {path!r} is not callable")
    return target


# The values of ``model.name``, each with its options class; an unregistered
# ``package.module:function`` is a user's builder.
MODELS: Registry[type[ModelConfig]] = Registry("model.name", "model",
                                               by_path=lambda path: CustomModelConfig)
MODELS.register("dlrm", DLRMConfig)
MODELS.register("dlrm_projection", DLRMProjectionConfig)
MODELS.register("deepfm", DeepFMConfig)
MODELS.register("wide_deep", WideDeepConfig)
MODELS.register("dcn", DCNConfig)
MODELS.register("autoint", AutoIntConfig)
