"""Environment ids: each built-in environment registers itself with [`register_env`][multiagent_rl.envs.registry.register_env],
as algorithms do; ``[[env]] id = "kuhn_poker"`` finds it, and so does any ``"package.module:EnvClass"`` path.

```pycon
>>> from multiagent_rl.envs.registry import ENVS
>>> "leduc_poker" in ENVS and ENVS["kuhn_poker"].__name__
'KuhnPokerEnv'

```
"""

from __future__ import annotations

import importlib
import pkgutil

from ..registry import Registry
from .base import Env


def _import_builtin_envs() -> None:
    """Import every environment package shipped under ``multiagent_rl/envs/`` (each registers itself)."""
    from .. import envs

    for module in pkgutil.iter_modules(envs.__path__):
        if module.ispkg:
            importlib.import_module(f"{envs.__name__}.{module.name}")


ENVS: Registry[type[Env]] = Registry("env id", base=Env, discover=_import_builtin_envs)
"""Registered environment classes by id."""


def register_env(env_id: str):
    """Class decorator: register an ``Env`` subclass under ``env_id`` (the id configs use).

    ```python
    @register_env("debate")
    class Debate(Env):
        roles = ("pro", "con")
    ```
    """

    def decorate(cls: type[Env]) -> type[Env]:
        if not (isinstance(cls, type) and issubclass(cls, Env)):
            raise TypeError(f"register_env({env_id!r}) decorates Env subclasses, not {cls!r}")
        return ENVS.register(env_id, cls)

    return decorate
