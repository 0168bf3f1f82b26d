"""Every extension point (``sync.strategy.name``, ``model.name``, ``data.name``) is one
:class:`~shadowsync.registry.Registry`: same lookup, same errors naming the config field."""

from __future__ import annotations

import pytest

from shadowsync.datasets import DATASETS, SyntheticCriteo
from shadowsync.models import MODELS, CustomModelConfig, DLRMConfig
from shadowsync.registry import Registry
from shadowsync.sync import ALGORITHMS, Algorithm
from shadowsync.sync.config import CustomStrategyConfig, EASGDConfig


def test_each_package_registers_its_values_under_its_config_field() -> None:
    assert (ALGORITHMS.key, MODELS.key, DATASETS.key) == ("sync.strategy.name", "model.name",
                                                          "data.name")
    assert ALGORITHMS.get("torch_averager").schedule == ("period",)
    assert ALGORITHMS.get("easgd").options is EASGDConfig
    assert MODELS.get("dlrm") is DLRMConfig
    assert isinstance(DATASETS.get("synthetic")(num_train_examples=64), SyntheticCriteo)


@pytest.mark.parametrize(("registry", "message"), [
    (ALGORITHMS, r"sync.strategy.name: unknown strategy 'nope'; known: \['bmuf', .*\], or an "
                 "import path 'package.module:attr'"),
    (MODELS, r"model.name: unknown model 'nope'; known: \['autoint', .*\], or an import path"),
    (DATASETS, r"data.name: unknown data set 'nope'; known: \['criteo_npy', .*'synthetic'\]$"),
])
def test_an_unknown_value_names_the_field_and_the_known_values(
        registry: Registry[object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        registry.get("nope")


def test_import_paths_name_ones_own_extension_where_the_field_takes_them() -> None:
    assert ALGORITHMS.get("my_pkg.sync:MyAveraging") == Algorithm(
        "my_pkg.sync:MyAveraging", strategy=True, options=CustomStrategyConfig)
    assert MODELS.get("my_pkg.models:build") is CustomModelConfig
    with pytest.raises(ValueError, match="data.name: unknown data set 'my_pkg.data:Mine'"):
        DATASETS.get("my_pkg.data:Mine")


def test_registering_twice_and_renamed_values_fail_naming_the_field() -> None:
    registry: Registry[int] = Registry("x.kind", "kind")
    assert registry.register("one", 1) == 1
    registry.rename("uno", "one")
    for name in ("one", "uno"):
        with pytest.raises(ValueError, match=f"x.kind: kind '{name}' is registered twice"):
            registry.register(name, 2)
    with pytest.raises(ValueError, match="x.kind: 'uno' was renamed; use 'one'"):
        registry.get("uno")
    assert registry.names() == ["one"] and "uno" not in registry
