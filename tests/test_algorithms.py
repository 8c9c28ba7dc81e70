"""Credit rules and teacher streams against hand-computed oracles."""

from __future__ import annotations

import asyncio
import json
import math
import os

os.environ["HF_HUB_OFFLINE"] = "1"

import pydantic
import pytest
import torch
import transformers

from multiagent_rl.episodes.records import trace_record
from multiagent_rl.algorithms import (
    ALGORITHMS,
    AlgorithmContext,
    build_algorithm,
    parse_algorithm_config,
)
from multiagent_rl.algorithms.echo import EchoConfig
from multiagent_rl.algorithms.grpo import GRPOConfig
from multiagent_rl.backends import SamplingParams, TransformersBackend
from multiagent_rl.episodes.episode import Episode
from multiagent_rl.envs.proposer_solver.rewards import learnability
from multiagent_rl.backends.scoring import token_logprobs
from multiagent_rl.tasks.task import Task, TaskData
from multiagent_rl.episodes.trace import Segment, Trace

# -- builders -------------------------------------------------------------------------------


def make_trace(agent: str, reward: float, segments=None, trainable: bool = True, error: str | None = None) -> Trace:
    """Default tokens: prompt [1, 2], action [3, 4], observation [5], action [6]."""
    if segments is None:
        segments = [("prompt", [1, 2]), ("action", [3, 4]), ("observation", [5]), ("action", [6])]
    t = Trace(
        role=agent,
        trainable=trainable,
        error=error,
        segments=[
            Segment(kind, list(ids), [-0.5] * len(ids) if kind == "action" else None) for kind, ids in segments
        ],
    )
    t.add_reward("outcome", reward)
    return t


def make_episode(traces, i=0, env="env", ok=True, task=None) -> Episode:
    return Episode(id=f"ep{i}", task=task or Task(TaskData(prompt="p", id="t")), group="g", env=env, traces=traces, ok=ok)


def rl_value(trace: Trace) -> float:
    """The single advantage written on a trace's action tokens (checks it is 0 elsewhere)."""
    s = trace.streams
    kinds = trace.token_kinds
    assert s is not None and len(s.advantages) == len(kinds)
    vals = {v for v, k in zip(s.advantages, kinds) if k == "action"}
    assert len(vals) == 1
    assert all(v == 0 for v, k in zip(s.advantages, kinds) if k != "action")
    return vals.pop()


def run(coro):
    return asyncio.run(coro)


# -- rewards --------------------------------------------------------------------------------


def test_learnability():
    assert learnability(0.5) == 1.0
    assert learnability(0.0) == 0.0 and learnability(1.0) == 0.0
    assert learnability(0.25) == pytest.approx(0.75)
    assert learnability(0.9) == pytest.approx(4 * 0.9 * 0.1)


# -- GRPO -----------------------------------------------------------------------------------


def two_role_group():
    # player_0 rewards in {0, 1}; player_1 rewards on a much larger scale.
    r0 = [1.0, 0.0, 1.0, 1.0]
    r1 = [10.0, 30.0, 20.0, 0.0]
    return [make_episode([make_trace("player_0", a), make_trace("player_1", b)], i) for i, (a, b) in enumerate(zip(r0, r1))], r0, r1


def test_grpo_per_role_not_pooled():
    episodes, r0, r1 = two_role_group()
    algo = build_algorithm({"type": "grpo"})
    algo.score_group(episodes)
    a0 = [rl_value(e.traces[0]) for e in episodes]
    a1 = [rl_value(e.traces[1]) for e in episodes]
    assert a0 == pytest.approx([0.25, -0.75, 0.25, 0.25])  # mean 0.75
    assert a1 == pytest.approx([-5.0, 15.0, 5.0, -15.0])  # mean 15
    assert sum(a0) == pytest.approx(0) and sum(a1) == pytest.approx(0)
    # pooled baseline would be (3 + 60) / 8 = 7.875; make sure it was not used
    assert a0[0] != pytest.approx(1 - 7.875)
    for e in episodes:
        for t in e.traces:
            assert t.streams.algorithm == "grpo"
            assert t.streams.ce_weights is None and t.streams.ref_kl_weights is None and t.streams.ref_logprobs is None


def test_grpo_std_scaling_matches_unbiased_std():
    episodes, r0, r1 = two_role_group()
    build_algorithm({"type": "grpo", "scale_rewards": True}).score_group(episodes)
    for role_idx, rewards in ((0, r0), (1, r1)):
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1))
        assert std == pytest.approx(torch.tensor(rewards).std().item())
        expected = [(r - mean) / (std + 1e-4) for r in rewards]
        assert [rl_value(e.traces[role_idx]) for e in episodes] == pytest.approx(expected)


def test_grpo_role_with_several_traces_per_episode():
    episodes = [
        make_episode([make_trace("solver", 1.0), make_trace("solver", 0.0)], 0),
        make_episode([make_trace("solver", 1.0), make_trace("solver", 1.0)], 1),
    ]
    build_algorithm({"type": "grpo"}).score_group(episodes)
    got = [rl_value(t) for e in episodes for t in e.traces]
    assert got == pytest.approx([0.25, -0.75, 0.25, 0.25])


def test_untrained_traces_untouched():
    frozen = make_trace("player_0", 5.0, trainable=False)
    failed = make_trace("player_0", 7.0, error="timeout")
    bad_episode_trace = make_trace("player_0", 9.0)
    other_role = make_trace("player_1", 1.0)
    episodes = [
        make_episode([make_trace("player_0", 1.0), frozen, other_role], 0),
        make_episode([make_trace("player_0", 0.0), failed], 1),
        make_episode([bad_episode_trace], 2, ok=False),
    ]
    before = [trace_record(t) for t in (frozen, failed, bad_episode_trace, other_role)]
    for cfg in ({"type": "grpo"}, {"type": "max_rl"}, {"type": "rae"}, {"type": "sft"}, {"type": "echo"},
                {"type": "hierarchical_grpo"}):
        build_algorithm(cfg).score_group(episodes, roles={"player_0"})
        after = [trace_record(t) for t in (frozen, failed, bad_episode_trace, other_role)]
        assert after == before, cfg
        assert all(t.streams is None for t in (frozen, failed, bad_episode_trace, other_role))
    # only the two clean player_0 traces are peers: mean 0.5
    build_algorithm({"type": "grpo"}).score_group(episodes, roles={"player_0"})
    assert rl_value(episodes[0].traces[0]) == pytest.approx(0.5)
    assert rl_value(episodes[1].traces[0]) == pytest.approx(-0.5)
    # rewards/segments of trained traces are unchanged too
    assert episodes[0].traces[0].reward == 1.0
    assert episodes[0].traces[0].token_ids == [1, 2, 3, 4, 5, 6]


# -- MaxRL ----------------------------------------------------------------------------------


def test_max_rl():
    episodes = [make_episode([make_trace("s", r), make_trace("p", 0.0)], i) for i, r in enumerate([1.0, 0.0, 0.0, 0.0])]
    build_algorithm({"type": "max_rl"}).score_group(episodes)
    # p̄ = 0.25 for role s: (1 - 0.25)/0.25 = 3, (0 - 0.25)/0.25 = -1
    assert [rl_value(e.traces[0]) for e in episodes] == pytest.approx([3.0, -1.0, -1.0, -1.0])
    # role p never solved: p̄ = 0 -> A = 0
    assert [rl_value(e.traces[1]) for e in episodes] == [0.0, 0.0, 0.0, 0.0]


# -- RAE ------------------------------------------------------------------------------------


def test_rae_sequence_and_state_dict_roundtrip():
    def calls():
        return [
            [make_episode([make_trace("prop", 1.0), make_trace("solv", 0.0)], 0, env="a"),
             make_episode([make_trace("prop", 0.0)], 1, env="b")],
            [make_episode([make_trace("prop", 1.0), make_trace("solv", 1.0)], 0, env="a")],
            [make_episode([make_trace("prop", 0.0), make_trace("solv", 1.0)], 0, env="a"),
             make_episode([make_trace("prop", 1.0)], 1, env="b")],
        ]

    # hand computation, d = 0.5:
    # call 1: a/prop: A=1-0=1, b=0.5 | a/solv: A=0, b=0 | b/prop: A=0, b=0
    # call 2: a/prop: A=1-0.5=0.5, b=0.75 | a/solv: A=1, b=0.5
    # call 3: a/prop: A=0-0.75=-0.75, b=0.375 | a/solv: A=1-0.5=0.5, b=0.75 | b/prop: A=1, b=0.5
    expected = [[1.0, 0.0, 0.0], [0.5, 1.0], [-0.75, 0.5, 1.0]]
    algo = build_algorithm({"type": "rae", "decay": 0.5})
    for groups, exp in zip(calls(), expected):
        algo.score_group(groups)
        assert [rl_value(t) for e in groups for t in e.traces] == pytest.approx(exp)
    assert algo.state_dict() == {"baselines": pytest.approx({"a/prop": 0.375, "a/solv": 0.75, "b/prop": 0.5})}

    # save after call 1, restore into a fresh instance: it must continue identically
    first = build_algorithm({"type": "rae", "decay": 0.5})
    data = calls()
    first.score_group(data[0])
    saved = json.loads(json.dumps(first.state_dict()))
    fresh = build_algorithm({"type": "rae", "decay": 0.5})
    fresh.load_state_dict(saved)
    for groups, exp in zip(data[1:], expected[1:]):
        fresh.score_group(groups)
        assert [rl_value(t) for e in groups for t in e.traces] == pytest.approx(exp)
    assert fresh.state_dict() == algo.state_dict()


def test_rae_default_decay():
    algo = build_algorithm({"type": "rae"})
    algo.score_group([make_episode([make_trace("x", 2.0)])])
    assert algo.state_dict()["baselines"]["env/x"] == pytest.approx(0.05 * 2.0)


# -- hierarchical GRPO ----------------------------------------------------------------------


def test_hierarchical_grpo_keys():
    # each episode: one proposer, two solvers on the proposer's problem
    episodes = [
        make_episode([make_trace("proposer", 1.0), make_trace("solver", 1.0), make_trace("solver", 0.0)], 0),
        make_episode([make_trace("proposer", 0.0), make_trace("solver", 1.0), make_trace("solver", 1.0)], 1),
    ]
    build_algorithm({"type": "hierarchical_grpo", "episode_group_roles": ["solver"]}).score_group(episodes)
    # proposer: group peers, mean 0.5
    assert [rl_value(e.traces[0]) for e in episodes] == pytest.approx([0.5, -0.5])
    # solvers: in-episode peers; episode 0 mean 0.5, episode 1 mean 1
    assert [rl_value(t) for t in episodes[0].traces[1:]] == pytest.approx([0.5, -0.5])
    assert [rl_value(t) for t in episodes[1].traces[1:]] == pytest.approx([0.0, 0.0])
    # without in-episode roles it is plain GRPO: solver mean over the group = 0.75
    build_algorithm({"type": "hierarchical_grpo"}).score_group(episodes)
    assert [rl_value(t) for e in episodes for t in e.traces[1:]] == pytest.approx([0.25, -0.75, 0.25, 0.25])


def test_hierarchical_grpo_scaled():
    episodes = [make_episode([make_trace("s", 1.0), make_trace("s", 0.0), make_trace("s", 0.0)], 0)]
    build_algorithm({"type": "hierarchical_grpo", "episode_group_roles": ["s"], "scale_rewards": True}).score_group(
        episodes
    )
    std = torch.tensor([1.0, 0.0, 0.0]).std().item()
    mean = 1 / 3
    assert [rl_value(t) for t in episodes[0].traces] == pytest.approx(
        [(1 - mean) / (std + 1e-4), -mean / (std + 1e-4), -mean / (std + 1e-4)]
    )


# -- SFT / ECHO -----------------------------------------------------------------------------


def test_sft_ce_mask():
    t = make_trace("teacher", 0.0)
    build_algorithm({"type": "sft"}).score_group([make_episode([t])])
    assert t.streams.ce_weights == [0.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    assert t.streams.advantages is None and t.streams.ref_kl_weights is None
    assert t.streams.algorithm == "sft"
    assert ALGORITHMS["sft"].samples_from_policy is False
    assert ALGORITHMS["grpo"].samples_from_policy is True


def test_echo_observations_after_first_action_and_role_alpha():
    segs = [("prompt", [1]), ("observation", [2, 3]), ("action", [4]), ("observation", [5, 6]), ("action", [7]),
            ("observation", [8])]
    episodes = [
        make_episode([make_trace("a", 1.0, segs), make_trace("b", 2.0, segs)], 0),
        make_episode([make_trace("a", 0.0, segs), make_trace("b", 0.0, segs)], 1),
    ]
    algo = build_algorithm({"type": "echo", "role_alpha": {"b": 0.5}})
    assert algo.loss_types == ("rl", "ce")
    algo.score_group(episodes)
    ta, tb = episodes[0].traces
    # observations [2, 3] precede the first action: no ce weight
    assert ta.streams.ce_weights == [0, 0, 0, 0, 0.1, 0.1, 0, 0.1]
    assert tb.streams.ce_weights == [0, 0, 0, 0, 0.5, 0.5, 0, 0.5]
    # rl part is per-role GRPO
    assert ta.streams.advantages == [0, 0, 0, 0.5, 0, 0, 0.5, 0]
    assert tb.streams.advantages == [0, 0, 0, 1.0, 0, 0, 1.0, 0]
    assert rl_value(episodes[1].traces[1]) == pytest.approx(-1.0)
    assert ta.streams.algorithm == "echo" and ta.streams.ref_kl_weights is None
    # echo's credit is grpo's
    other = [make_episode([make_trace("a", r, segs)], i) for i, r in enumerate([1.0, 0.0, 0.5])]
    mirror = [make_episode([make_trace("a", r, segs)], i) for i, r in enumerate([1.0, 0.0, 0.5])]
    build_algorithm({"type": "echo", "scale_rewards": True}).score_group(other)
    build_algorithm({"type": "grpo", "scale_rewards": True}).score_group(mirror)
    assert [e.traces[0].streams.advantages for e in other] == [e.traces[0].streams.advantages for e in mirror]


# -- registry -------------------------------------------------------------------------------


def test_registry():
    assert set(ALGORITHMS) == {"grpo", "max_rl", "rae", "hierarchical_grpo", "opd", "opsd", "sft", "echo"}
    with pytest.raises(ValueError, match="known types") as err:
        parse_algorithm_config({"type": "ppo"})
    assert "grpo" in str(err.value) and "ppo" in str(err.value)
    with pytest.raises(ValueError, match="type"):
        parse_algorithm_config({"alpha": 0.1})
    with pytest.raises(pydantic.ValidationError, match="scale_reward"):
        parse_algorithm_config({"type": "grpo", "scale_reward": True})
    with pytest.raises(pydantic.ValidationError, match="teacher"):
        parse_algorithm_config({"type": "opd"})
    cfg = parse_algorithm_config({"type": "echo", "alpha": 0.3})
    assert isinstance(cfg, EchoConfig) and cfg.alpha == 0.3
    same = GRPOConfig(scale_rewards=True)
    assert parse_algorithm_config(same) is same
    algo = build_algorithm(same)
    assert algo.name == "grpo" and algo.config.scale_rewards
    assert build_algorithm({"type": "hierarchical_grpo"}).name == "hierarchical_grpo"
    # every field is documented
    for cls in ALGORITHMS.values():
        for field_name, field in cls.config_class.model_fields.items():
            assert field.description, f"{cls.config_class.__name__}.{field_name} has no docstring"


# -- scoring and teachers --------------------------------------------------------------------


def tiny_model(seed: int = 0):
    torch.manual_seed(seed)
    config = transformers.Qwen2Config(
        vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1,
    )
    return transformers.Qwen2ForCausalLM(config).eval()


def direct_logprobs(model, seq: list[int]) -> list[float | None]:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([seq])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    return [None] + [logp[j - 1, seq[j]].item() for j in range(1, len(seq))]


def assert_close(got, expected, tol=1e-5):
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        if e is None:
            assert g is None
        else:
            assert g is not None and abs(g - e) < tol


def test_token_logprobs_matches_unpadded_forward():
    model = tiny_model()
    model.train()
    seqs = [[1, 5, 9, 3, 7, 2, 11], [4, 8], [6, 1, 2, 3], [7], [], [10, 20, 30, 40, 49]]
    out = token_logprobs(model, seqs, batch_size=4)  # two batches, padded
    assert model.training  # flag restored
    model.eval()
    for seq, got in zip(seqs, out):
        assert_close(got, direct_logprobs(model, seq) if seq else [])
    with pytest.raises(ValueError, match="vocabulary"):
        token_logprobs(model, [[1, 50]])


class StubTokenizerIds:
    """The ids a backend needs from a tokenizer."""

    eos_token_id, pad_token_id = 2, 0


def test_opd_teacher_logprobs_on_actions():
    teacher = tiny_model(1)
    loaded = []

    def load_backend(name):
        loaded.append(name)
        return TransformersBackend(teacher, StubTokenizerIds(), model_id=name)

    segs = [("prompt", [1, 2, 3]), ("action", [4, 5]), ("observation", [6]), ("action", [7, 8])]
    t1 = make_trace("student", 1.0, segs)
    t2 = make_trace("student", 0.0, [("prompt", [9]), ("action", [10, 11, 12])])
    frozen = make_trace("other", 0.0, segs, trainable=False)
    episode = make_episode([t1, t2, frozen])
    algo = build_algorithm({"type": "opd", "teacher": "some/teacher"})
    assert algo.loss_types == ("ref_kl",)
    run(algo.setup(AlgorithmContext(tokenizer=None, load_backend=load_backend)))
    assert loaded == ["some/teacher"]
    run(algo.score_episode(episode))
    algo.score_group([episode])  # no-op
    for t in (t1, t2):
        direct = direct_logprobs(teacher, t.token_ids)
        kinds = t.token_kinds
        assert_close(t.streams.ref_logprobs, [lp if k == "action" else None for lp, k in zip(direct, kinds)])
        assert t.streams.ref_kl_weights == [1.0 if k == "action" else 0.0 for k in kinds]
        assert t.streams.advantages is None and t.streams.ce_weights is None and t.streams.algorithm == "opd"
    assert frozen.streams is None

    # tokens outside the teacher's vocabulary: clear error
    bad = make_episode([make_trace("student", 0.0, [("prompt", [1]), ("action", [77])])])
    with pytest.raises(ValueError, match="vocabulary"):
        run(algo.score_episode(bad))


class StubTokenizer:
    """Chat template stand-in: a system message becomes [40, 41] + one id per word (mod 30)."""

    def __init__(self, as_dict: bool):
        self.as_dict = as_dict
        self.seen = []

    def __len__(self):
        return 50

    def apply_chat_template(self, messages, tokenize=True):
        assert tokenize
        self.seen.append(messages)
        ids = [40, 41] + [len(w) % 30 for w in messages[0]["content"].split()]
        return transformers.BatchEncoding({"input_ids": ids}) if self.as_dict else ids


@pytest.mark.parametrize("mode", ["frozen", "live"])
def test_opsd_drops_hint_positions(mode):
    policy = tiny_model(2)
    policy.train()
    tok = StubTokenizer(as_dict=(mode == "frozen"))
    algo = build_algorithm({"type": "opsd", "teacher": mode, "template": "Solution: {demonstration}"})
    tok.eos_token_id, tok.pad_token_id = 2, 0
    live = TransformersBackend(policy, tok, model_id="policy")
    run(algo.setup(AlgorithmContext(policy_backend=live, policy_model=policy, tokenizer=tok)))
    if mode == "frozen":
        assert algo.teacher.model is not policy and not algo.teacher.model.training
        assert not any(p.requires_grad for p in algo.teacher.model.parameters())
        with torch.no_grad():  # later policy updates do not reach the frozen copy
            for p in policy.parameters():
                p.add_(0.5)
        reference = algo.teacher.model
    else:
        assert algo.teacher is live and algo.teacher.model is policy
        reference = policy

    segs = [("prompt", [1, 2]), ("action", [3, 4]), ("observation", [5]), ("action", [6])]
    with_info = make_episode([make_trace("s", 1.0, segs)], 0, task=Task(TaskData(info={"demonstration": "x = 12"})))
    with_answer = make_episode([make_trace("s", 1.0, segs)], 1, task=Task(TaskData(answer="42")))
    without = make_episode([make_trace("s", 1.0, segs)], 2, task=Task(TaskData(prompt="no demo")))
    for ep in (with_info, with_answer, without):
        run(algo.score_episode(ep))
    assert policy.training  # the live policy's mode is restored
    assert tok.seen[0] == [{"role": "system", "content": "Solution: x = 12"}]
    assert tok.seen[1] == [{"role": "system", "content": "Solution: 42"}]
    assert without.traces[0].streams is None and algo.skipped == 1

    for ep, words in ((with_info, ["Solution:", "x", "=", "12"]), (with_answer, ["Solution:", "42"])):
        hint = [40, 41] + [len(w) % 30 for w in words]
        trace = ep.traces[0]
        reference.eval()
        direct = direct_logprobs(reference, hint + trace.token_ids)[len(hint):]
        kinds = trace.token_kinds
        assert_close(trace.streams.ref_logprobs, [lp if k == "action" else None for lp, k in zip(direct, kinds)])
        assert trace.streams.ref_kl_weights == [1.0 if k == "action" else 0.0 for k in kinds]
        assert trace.streams.algorithm == "opsd"
        # the hint matters: without it the action logprobs differ
        plain = direct_logprobs(reference, trace.token_ids)
        assert any(abs(plain[j] - trace.streams.ref_logprobs[j]) > 1e-4 for j, k in enumerate(kinds) if k == "action")
    policy.train()


# -- the algorithm surface: import paths, declared streams ---------------------------------------

ALGORITHM_MODULE = '''
from typing import Literal
from multiagent_rl.algorithms.base import Algorithm, AlgorithmConfig, on_kind, trained_traces
from multiagent_rl.episodes.trace import TokenStreams


class ConstantConfig(AlgorithmConfig):
    type: Literal["constant_advantage"] = "constant_advantage"
    value: float = 1.0


class ConstantAdvantage(Algorithm):
    config_class = ConstantConfig
    loss_types = ("rl",)

    def score_group(self, episodes, roles=None):
        for _, _, t in trained_traces(episodes, roles):
            t.streams = TokenStreams(self.name, advantages=on_kind(t, "action", self.config.value))


class UndeclaredConfig(AlgorithmConfig):
    type: Literal["writes_undeclared"] = "writes_undeclared"


class WritesUndeclared(ConstantAdvantage):
    config_class = UndeclaredConfig

    def score_group(self, episodes, roles=None):
        for _, _, t in trained_traces(episodes, roles):
            t.streams = TokenStreams(self.name, advantages=on_kind(t, "action", 1.0), ce_weights=on_kind(t, "action", 1.0))
'''


@pytest.fixture
def registry():
    """Algorithms a test registers are forgotten afterwards."""
    from multiagent_rl.algorithms.base import ALGORITHMS

    saved = dict(ALGORITHMS)
    yield ALGORITHMS
    ALGORITHMS.clear()
    ALGORITHMS.update(saved)


def test_an_algorithm_is_reachable_by_import_path(tmp_path, monkeypatch, registry):
    from multiagent_rl.config import ExperimentConfig

    (tmp_path / "my_algos.py").write_text(ALGORITHM_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = ExperimentConfig.model_validate({"algo": {"type": "my_algos:ConstantAdvantage", "value": 0.5},
                                              "env": [{"id": "kuhn_poker"}]})
    assert config.algo.type == "constant_advantage" and config.algo.value == 0.5
    algo = build_algorithm(config.algo)
    episode = make_episode([make_trace("a", 0.0)])
    algo.score_group([episode])
    assert rl_value(episode.traces[0]) == 0.5
    with pytest.raises(ValueError, match="cannot import algorithm 'my_algos:Nope'"):
        build_algorithm({"type": "my_algos:Nope"})


def test_declared_loss_types_are_enforced(tmp_path, monkeypatch, registry):
    from multiagent_rl.algorithms.base import Algorithm, AlgorithmConfig, register

    class KLConfig(AlgorithmConfig):
        type: str = "declares_unknown_stream"

    @register
    class DeclaresUnknown(Algorithm):
        config_class = KLConfig
        loss_types = ("kl",)

    with pytest.raises(TypeError, match=r"loss_types = \('kl',\) must name one or more of \('rl', 'ce', 'ref_kl'\)"):
        build_algorithm({"type": "declares_unknown_stream"})
    (tmp_path / "my_algos2.py").write_text(ALGORITHM_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    from multiagent_rl.envs.base import SingleAgentEnv
    from multiagent_rl.rollout.engine import Orchestrator

    env = SingleAgentEnv([{"prompt": "hi"}], reward=lambda task, trace: 1.0)
    orchestrator = Orchestrator.from_config({"algo": {"type": "my_algos2:WritesUndeclared"},
                                             "env": [{"id": "s", "instance": env, "group_size": 2}]},
                                            groups_per_step=1, sampling=SamplingParams(max_new_tokens=2))
    episodes = orchestrator.play(0)
    with pytest.raises(TypeError, match=r"wrote the ce stream on role 'agent' but declares loss_types = \('rl',\)"):
        orchestrator.score(episodes)
