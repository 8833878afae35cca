"""Architecture families by Hugging Face class name (config.json "architectures").

Each family module registers its class with @register("LlamaForCausalLM", ...); the converter
looks the checkpoint's class up here and fails with the list of supported ones otherwise.
"""

from __future__ import annotations

from typing import Callable, TypeVar

from .errors import ConvertError

T = TypeVar("T", bound=type)

_FAMILIES: dict[str, type] = {}


def register(*hf_class_names: str) -> Callable[[T], T]:
    """Class decorator: the family converts checkpoints whose architectures name one of these."""

    def add(cls: T) -> T:
        for name in hf_class_names:
            if name in _FAMILIES and _FAMILIES[name] is not cls:
                raise RuntimeError(f"{name} is registered twice ({_FAMILIES[name].__name__}, "
                                   f"{cls.__name__})")
            _FAMILIES[name] = cls
        return cls

    return add


def supported_architectures() -> list[str]:
    """Every Hugging Face class name the converter accepts, sorted."""
    return sorted(_FAMILIES)


def family_for(config: dict, where: str) -> type:
    """The family class registered for config["architectures"]; `where` names the config file."""
    names = config.get("architectures") or []
    if not isinstance(names, list) or not names:
        raise ConvertError(f"{where}: no \"architectures\" list; cannot tell the model family "
                           f"(supported: {', '.join(supported_architectures())})")
    for name in names:
        if name in _FAMILIES:
            return _FAMILIES[name]
    raise ConvertError(f"{where}: architecture {', '.join(map(str, names))} is not supported; "
                       f"supported: {', '.join(supported_architectures())}")
