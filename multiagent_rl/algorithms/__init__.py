"""Algorithms: credit rules and extra token streams written onto trainable traces.

``build_algorithm({"type": "grpo"})`` builds one from a config; [`ALGORITHMS`][multiagent_rl.algorithms.ALGORITHMS]
lists them.
"""

from .base import (
    ALGORITHMS,
    Algorithm,
    AlgorithmConfig,
    AlgorithmContext,
    build_algorithm,
    parse_algorithm_config,
    register,
)
from .echo import Echo, EchoConfig
from .grpo import GRPO, GRPOConfig
from .hierarchical_grpo import HierarchicalGRPO, HierarchicalGRPOConfig
from .max_rl import MaxRL, MaxRLConfig
from .opd import OPD, OPDConfig
from .opsd import OPSD, OPSDConfig
from .rae import RAE, RAEConfig
from .sft import SFT, SFTConfig

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "AlgorithmConfig",
    "AlgorithmContext",
    "build_algorithm",
    "parse_algorithm_config",
    "register",
    "GRPO",
    "GRPOConfig",
    "MaxRL",
    "MaxRLConfig",
    "RAE",
    "RAEConfig",
    "HierarchicalGRPO",
    "HierarchicalGRPOConfig",
    "OPD",
    "OPDConfig",
    "OPSD",
    "OPSDConfig",
    "SFT",
    "SFTConfig",
    "Echo",
    "EchoConfig",
]
