"""The agentic judge: solver → tests in the sandbox → judge with tools → rubric verdict → rewards."""

import random

import pytest

import multiagent_rl as mrl
from multiagent_rl.envs.agentic_judge import (ATTACKS, LETTERS, AgenticJudgeEnv, code_solver, examples_judge,
                                              labelled_solver)
from multiagent_rl.envs.agentic_judge.tasks import CODE_TASKS, run_tests_locally
from multiagent_rl.tools.rubric import Criterion, Rubric, VerdictError
from multiagent_rl.tools.sandbox import bwrap_available
from multiagent_rl.tasks.task import Task, TaskData
from multiagent_rl.tools import tool_call_text

pytestmark = pytest.mark.skipif(not bwrap_available(), reason="bubblewrap is not installed (apt-get install bubblewrap)")


def seat(policy, **config):
    return mrl.make_agent(mrl.AgentConfig(model="scripted", policy=policy, sampling={"max_new_tokens": 1024},
                                          **config))


def judge_seat(policy=None):
    return seat(policy or examples_judge(), harness={"id": "tools"})


def play(env, solver_policy, judge=None, tasks=None, judge_trainable=None):
    tasks = tasks or [Task(TaskData(prompt=env_prompt(env, t), info={"task_id": t.id})) for t in env.tasks]
    agents = {"solver": seat(solver_policy), "judge": judge or judge_seat()}
    trainable = {"solver": True, "judge": bool(judge_trainable)}
    return mrl.run_sync(mrl.play_episodes(env, tasks, agents, seed="0", trainable=trainable))


def env_prompt(env, task):
    from multiagent_rl.envs.agentic_judge import solver_prompt
    return solver_prompt(task, env.solver_mode)


def pick(letter_of):
    """A solver that picks the candidate ``letter_of(task)`` names."""
    def act(turn):
        return letter_of(next(t for t in CODE_TASKS if t.id == turn.state["task_id"]))
    return act


def test_rubric_maps_verdicts_worst_to_best_onto_zero_one_and_refuses_bad_verdicts():
    rubric = Rubric(criteria=(Criterion(name="a", question="?", choices=("bad", "ok", "good"), weight=3),
                              Criterion(name="b", question="?", choices=("no", "yes"))))
    v = rubric.parse('thinking...\n```json\n{"verdicts": [{"name": "a", "reason": "r", "verdict": "OK"}, '
                     '{"name": "b", "reason": "r", "verdict": "yes"}]}\n```')
    assert rubric.score(v) == pytest.approx((3 * 0.5 + 1 * 1.0) / 4)
    with pytest.raises(VerdictError, match="not one of"):
        rubric.parse('{"verdicts": [{"name": "a", "verdict": "great"}, {"name": "b", "verdict": "yes"}]}')
    with pytest.raises(VerdictError, match=r"no verdict for \['b'\]"):
        rubric.parse('{"verdicts": [{"name": "a", "verdict": "good"}]}')
    with pytest.raises(VerdictError, match="no JSON object"):
        rubric.parse("I think it is fine.")
    assert rubric.parse(rubric.verdict_text({"a": "good", "b": "no"}))["b"].verdict == "no"


def test_the_scripted_judge_agrees_with_the_labels_on_every_candidate_of_every_task():
    env = AgenticJudgeEnv()
    for correct in (True, False):
        episodes = play(env, labelled_solver(correct))
        assert all(ep.ok for ep in episodes), [ep.errors for ep in episodes if not ep.ok]
        for ep in episodes:
            solver = ep.by_role("solver")[0]
            assert solver.metrics["correct"] == float(correct)
            assert solver.metrics["judged_pass"] == float(correct), solver.info
            assert ep.by_role("judge")[0].metrics["agrees"] == 1.0


def fitted_letter(task):
    """The incorrect candidate that passes every test (tricky tasks have one)."""
    for i, c in enumerate(task.candidates):
        if not c.correct and all(run_tests_locally(task, c.source).values()):
            return LETTERS[i]
    raise AssertionError(task.id)


@pytest.mark.parametrize("task_weight, judge_weight", [(0.0, 1.0), (1.0, 0.0), (0.3, 0.7)])
def test_a_test_fitting_wrong_solution_is_overruled_by_the_judge(task_weight, judge_weight):
    tricky = [t.id for t in CODE_TASKS if t.tricky]
    env = AgenticJudgeEnv(tasks=tricky, task_weight=task_weight, judge_weight=judge_weight)
    for ep in play(env, pick(fitted_letter)):
        solver = ep.by_role("solver")[0]
        m = solver.metrics
        assert (m["tests"], m["tests_pass"], m["correct"], m["fooled_tests"]) == (1.0, 1.0, 0.0, 1.0)
        assert m["judged_pass"] == 0.0 and m["judge_score"] < 1.0
        assert solver.reward == pytest.approx(task_weight * 1.0 + judge_weight * m["judge_score"])
        assert {r.name: r.weight for r in solver.rewards} == {"tests": task_weight, "judge": judge_weight}


def test_the_judge_reads_the_solver_transcript_and_uses_tools_in_the_sandbox():
    env = AgenticJudgeEnv(tasks=["clamp"])
    (ep,) = play(env, labelled_solver(True))
    judge = ep.by_role("judge")[0]
    prompt = judge.messages[0]["content"]
    assert "clamp(5, 0, 3) == 3" in prompt and "[assistant]" in prompt and '"verdicts"' in prompt
    (call,) = judge.info["tool_calls"]
    assert call["name"] == "check_examples" and call["ok"] and call["isolated"] is True
    assert [s.kind for s in judge.segments] == ["prompt", "action", "observation", "action"]
    assert not judge.trainable and not judge.rewards  # frozen by default: no reward needed


def test_an_unparseable_verdict_fails_the_episode_with_a_frozen_judge():
    env = AgenticJudgeEnv(tasks=["clamp"])
    (ep,) = play(env, labelled_solver(True), judge=judge_seat(lambda turn: "Looks fine to me."))
    assert not ep.ok and "no JSON object" in ep.errors[0]


def test_a_trained_judge_is_rewarded_by_agreement_and_without_a_verdict_the_tests_score_the_solver():
    env = AgenticJudgeEnv(tasks=["clamp", "median"])
    episodes = play(env, labelled_solver(False), judge_trainable=True)
    for ep in episodes:  # 1 - |score - truth|: "incorrect" earns 1, "partially correct" 0.5
        assert ep.by_role("judge")[0].reward == pytest.approx(1.0 - ep.by_role("solver")[0].metrics["judge_score"])

    def always_correct(turn):
        return turn.state["rubric"].verdict_text({"correctness": "correct"})

    for ep in play(env, labelled_solver(False), judge=judge_seat(always_correct), judge_trainable=True):
        assert ep.by_role("judge")[0].reward == 0.0
    (ep, _) = play(env, labelled_solver(False), judge=judge_seat(lambda turn: "no idea"), judge_trainable=True)
    solver, judge = ep.by_role("solver")[0], ep.by_role("judge")[0]
    assert ep.ok and judge.reward == 0.0 and judge.metrics["verdict"] == 0.0
    assert [r.name for r in solver.rewards] == ["tests"] and solver.reward == solver.metrics["tests"]


def test_write_mode_runs_model_code_and_checks_the_examples_in_the_sandbox():
    env = AgenticJudgeEnv(tasks=["clamp"], solver_mode="write")
    good = "def clamp(x, low, high):\n    return min(max(x, low), high)\n"
    (ep,) = play(env, code_solver(good))
    m = ep.by_role("solver")[0].metrics
    assert (m["tests"], m["correct"], m["judged_pass"]) == (1.0, 1.0, 1.0)
    (ep,) = play(env, code_solver("def clamp(x, low, high):\n    return x\n"))
    m = ep.by_role("solver")[0].metrics
    assert m["correct"] == 0.0 and m["judged_pass"] == 0.0


def workspaces_left() -> set[str]:
    import tempfile
    from pathlib import Path

    return {p.name for p in Path(tempfile.gettempdir()).glob("*") if p.name.startswith(("judge-", "truth-"))}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_every_attack_in_a_solution_is_penalised_recorded_and_leaves_nothing_behind(attack):
    """Write mode, the scripted examples judge: each attack ends as a finished episode with tests 0, ground truth 0,
    judged incorrect and rewards in range, or a recorded error; no workspace, mount or process is left."""
    env = AgenticJudgeEnv(tasks=["clamp"], solver_mode="write", call_timeout=1.0, solver_tokens=8192,
                          sandbox={"timeout": 4, "cpu_seconds": 2, "max_processes": 16, "memory_mb": 512})
    before = workspaces_left()
    source = ATTACKS[attack].replace("FUNCTION", "clamp")
    (ep,) = play(env, code_solver(source))
    assert ep.ok, ep.errors
    solver = ep.by_role("solver")[0]
    assert source in solver.last_reply  # the whole attack ran, not a cut-off reply
    m = solver.metrics
    assert (m["tests"], m["correct"], m["judged_pass"]) == (0.0, 0.0, 0.0), (attack, solver.info)
    assert all(0.0 <= r.value <= 1.0 for r in solver.rewards) and solver.reward == 0.0
    assert workspaces_left() <= before
    assert "judge-" not in open("/proc/mounts").read() and "truth-" not in open("/proc/mounts").read()


def test_the_sandboxed_grader_agrees_with_running_the_tests_locally_on_every_candidate():
    """The oracle: the built-in candidates (trusted code) run in this process, test by test and example by example;
    the grader, with the function in a process of its own and only plain data crossing, must give the same."""
    import asyncio

    from multiagent_rl.envs.agentic_judge.grading import grade
    from multiagent_rl.envs.agentic_judge.tasks import check_examples_locally
    from multiagent_rl.tools.sandbox import Sandbox, SandboxConfig

    config = SandboxConfig()

    async def both(task, source):
        with config.workspace() as ws:
            ws.write("solution.py", source)
            sandbox = Sandbox(ws, config)
            return await grade(sandbox, task, "tests"), await grade(sandbox, task, "examples")

    async def main():
        for task in CODE_TASKS:
            for candidate in task.candidates:
                tests, examples = await both(task, candidate.source)
                assert tests.complete and tests.passed == run_tests_locally(task, candidate.source), task.id
                assert examples.complete and examples.passed == check_examples_locally(task, candidate.source)
                assert examples.all_passed == candidate.correct, (task.id, candidate.note)

    asyncio.run(main())


def test_a_fifo_and_forged_names_in_the_workspace_cannot_freeze_or_fool_the_judges_tools():
    solution = ATTACKS["replace solution.py by a FIFO"] + "open('x\\nsolution.py', 'w').close()\n"
    env = AgenticJudgeEnv(tasks=["clamp"], solver_mode="write", call_timeout=1.0, sandbox={"timeout": 4},
                          solver_tokens=8192)
    reads = [tool_call_text("read_file", path="solution.py"), tool_call_text("list_files"),
             tool_call_text("read_file", path="/task/test_solution.py")]

    def judge(turn):
        done = sum(m["role"] == "tool" for m in turn.messages)
        return reads[done] if done < len(reads) else turn.state["rubric"].verdict_text({"correctness": "incorrect"})

    (ep,) = play(env, code_solver(solution.replace("FUNCTION", "clamp")),
                 judge=seat(judge, harness={"id": "tools", "max_tool_rounds": 5, "max_tool_calls_per_reply": 1}))
    assert ep.ok, ep.errors
    fifo, listing, tests = ep.by_role("judge")[0].info["tool_calls"]
    assert not fifo["ok"] and "not a regular file" in fifo["error"] and fifo["seconds"] < 2
    tool_results = [m["content"] for m in ep.by_role("judge")[0].messages if m["role"] == "tool"]
    assert repr("x\nsolution.py") in tool_results[1] and "/task/SPEC.md" in tool_results[1]
    assert "def test_inside" in tool_results[2]


def test_what_a_solution_plants_does_not_run_in_the_judges_python():
    """usercustomize, sitecustomize and a module named like the standard library's, planted while the tests ran,
    do not run in the judge's run_python (isolated mode) and do not shadow the standard library."""
    planted = (ATTACKS["plant usercustomize and sitecustomize"] + ATTACKS["shadow a standard module"]).replace(
        "FUNCTION", "clamp")
    env = AgenticJudgeEnv(tasks=["clamp"], solver_mode="write", solver_tokens=8192)
    program = "import json\nfrom solution import clamp\nprint(json.dumps([1, 2]), clamp(5, 0, 3))"

    def judge(turn):
        if not any(m["role"] == "tool" for m in turn.messages):
            return tool_call_text("run_python", code=program)
        return turn.state["rubric"].verdict_text({"correctness": "incorrect"})

    (ep,) = play(env, code_solver(planted), judge=seat(judge, harness={"id": "tools"}))
    (call,) = ep.by_role("judge")[0].info["tool_calls"]
    shown = [m["content"] for m in ep.by_role("judge")[0].messages if m["role"] == "tool"][0]
    assert call["ok"] and "[1, 2] None" in shown, shown


def test_a_reward_outside_the_envs_declared_range_fails_the_episode():
    class Forged(mrl.Env):
        roles = ("agent",)
        reward_ranges = {"tests": (0.0, 1.0)}

        async def run(self, task, agents):
            trace = await agents["agent"].run(task)
            trace.add_reward("tests", 12.75)

    agents = {"agent": seat(lambda turn: "hi")}
    (ep,) = mrl.run_sync(mrl.play_episodes(Forged(), [Task(TaskData(prompt="x"))], agents, trainable={"agent": True}))
    assert not ep.ok and "outside its declared range [0, 1]" in ep.errors[0] and "'tests' is 12.75" in ep.errors[0]
    assert AgenticJudgeEnv.reward_ranges == {"tests": (0.0, 1.0), "judge": (0.0, 1.0), "agreement": (0.0, 1.0)}


def attacking_judge():
    """A judge that tries every escape through its tools, then gives a verdict."""
    attacks = [
        tool_call_text("read_file", path="../../../../etc/passwd"),
        tool_call_text("read_file", path="/etc/shadow"),
        tool_call_text("run_python", code="print(open('/etc/shadow').read())"),
        tool_call_text("run_python", code="import socket; socket.create_connection(('127.0.0.1', 22), timeout=1)"),
        tool_call_text("run_python", code="import os\nwhile True:\n    os.fork()"),
        tool_call_text("run_python", code="while True: pass"),
        tool_call_text("run_python", code="import os; os.symlink('/etc', 'etc'); print('linked')"),
        tool_call_text("read_file", path="etc/passwd"),
    ]

    def act(turn):
        done = sum(m["role"] == "tool" for m in turn.messages)
        if done < len(attacks):
            return attacks[done]
        return turn.state["rubric"].verdict_text({"correctness": "incorrect"})

    return act


def test_a_judges_attacks_through_its_tools_are_stopped_recorded_and_the_run_goes_on():
    env = AgenticJudgeEnv(tasks=["clamp"], sandbox={"timeout": 3, "cpu_seconds": 2, "max_processes": 16})
    judge = seat(attacking_judge(), harness={"id": "tools", "max_tool_rounds": 10, "max_tool_calls_per_reply": 1})
    (ep,) = play(env, labelled_solver(True), judge=judge)
    assert ep.ok, ep.errors
    calls = ep.by_role("judge")[0].info["tool_calls"]
    assert len(calls) == 8
    escape_dotdot, escape_abs, shadow, network, bomb, loop, symlink, through_link = calls
    assert not escape_dotdot["ok"] and "outside the workspace" in escape_dotdot["error"]
    assert not escape_abs["ok"] and "absolute path" in escape_abs["error"]
    assert shadow["returncode"] != 0  # no /etc in the sandbox
    assert network["returncode"] != 0
    assert bomb["killed"] or bomb["returncode"] != 0
    assert loop["killed"] in ("timeout", "signal SIGXCPU", "signal SIGKILL")
    assert symlink["ok"] and not through_link["ok"] and "outside the workspace" in through_link["error"]
    judge_trace = ep.by_role("judge")[0]
    assert judge_trace.metrics["tool_errors"] >= 3 and judge_trace.metrics["commands_killed"] >= 1
    # and the next episode is unaffected
    (ep,) = play(env, labelled_solver(True))
    assert ep.ok and ep.by_role("solver")[0].metrics["judged_pass"] == 1.0


def test_sampled_tasks_cover_the_set_and_config_refuses_nonsense():
    env = AgenticJudgeEnv()
    ids = {t.data.info["task_id"] for t in env.sample_tasks(300, random.Random(0))}
    assert ids == {t.id for t in CODE_TASKS}
    with pytest.raises(ValueError, match="solver_mode"):
        AgenticJudgeEnv(solver_mode="guess")
    with pytest.raises(ValueError, match="not both 0"):
        AgenticJudgeEnv(task_weight=0, judge_weight=0)
    with pytest.raises(KeyError, match="valid ids"):
        AgenticJudgeEnv(tasks=["nope"])


def test_a_hostile_solver_run_of_the_recipe_finishes_with_every_attack_recorded_and_nothing_left(tmp_path):
    """`recipes/agentic_judge.py --solver hostile`: every attack of ATTACKS played (28 episodes, in turn), none
    judged correct, true or crashing the run, and no workspace, mount or control group left behind."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "recipes"))
    import agentic_judge as recipe

    summary = recipe.main(["--solver", "hostile", "--steps", "1", "--group-size", "4", "--groups-per-step", "7",
                           "--output-dir", str(tmp_path / "run")])
    attacks = summary["attacks"]
    assert set(attacks) == set(ATTACKS) and sum(a["episodes"] for a in attacks.values()) == 28
    for name, row in attacks.items():  # a None-returning function may meet an example that expects None: < 1
        assert row["correct"] == 0.0 and row["judged_pass"] == 0.0 and row["reward"] < 1.0, (name, row)
        assert row["failed"] == 0, (name, row["errors"])
    assert summary["left_on_the_machine"] == {"workspaces": [], "mounts": [], "control_groups": []}
