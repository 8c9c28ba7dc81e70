"""The tool harness: tool schemas, calls parsed from replies, results appended as observation tokens."""

import asyncio

import pytest

import multiagent_rl as mrl
from multiagent_rl.algorithms import build_algorithm
from multiagent_rl.tools import Tool, parse_tool_calls, tool_call_text


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


def explode(reason: str) -> str:
    """Always fails.

    Args:
        reason: Why.
    """
    raise RuntimeError(reason)


def scripted_tool_agent(replies, **harness):
    """A scripted seat with the tools harness that says ``replies`` in order (the last one forever)."""
    said = []

    def policy(turn):
        said.append(turn)
        return replies[min(len(said) - 1, len(replies) - 1)]

    agent = mrl.make_agent(mrl.AgentConfig(model="scripted", policy=policy, harness={"id": "tools", **harness},
                                           sampling={"max_new_tokens": 256}))
    return agent, said


def converse(agent, tools=(add, explode), prompt="What is 2 + 3?"):
    async def main():
        async with agent.interaction(mrl.Task(mrl.TaskData(prompt=prompt)), tools=list(tools)) as it:
            reply = await it.send()
        return reply, it.trace

    return asyncio.run(main())


def test_schema_comes_from_type_hints_and_docstring():
    schema = Tool.from_function(add).schema["function"]
    assert schema["name"] == "add" and schema["description"] == "Add two integers."
    assert schema["parameters"]["properties"] == {"a": {"type": "integer", "description": "The first."},
                                                  "b": {"type": "integer", "description": "The second."}}

    def undocumented(x):
        return x

    with pytest.raises(ValueError, match="type hints on every argument"):
        Tool.from_function(undocumented)


def test_a_tool_call_round_is_token_exact_and_the_result_is_an_observation():
    agent, said = scripted_tool_agent([tool_call_text("add", a=2, b=3), "It is 5."])
    reply, trace = converse(agent)
    assert reply == "It is 5."
    assert [s.kind for s in trace.segments] == ["prompt", "action", "observation", "action"]
    assert [m["role"] for m in trace.messages] == ["user", "assistant", "tool", "assistant"]
    assert trace.messages[2]["content"] == "5"
    assert said[1].messages[-1] == {"role": "tool", "name": "add", "content": "5"}  # the policy read the result
    # Earlier turns are never re-tokenised: the whole trace is exactly the template's rendering of the
    # conversation (with the tools in the system block), turn by turn.
    tok, template = agent.tokenizer, agent.template
    schemas = [Tool.from_function(f).schema for f in (add, explode)]
    full = tok.apply_chat_template(trace.messages, tools=schemas, tokenize=False)
    assert tok.decode(trace.token_ids) + "\n" == full
    assert "<tools>" in tok.decode(trace.segments[0].token_ids) and '"name": "add"' in full
    obs = tok.decode(trace.segments[2].token_ids)
    assert obs.startswith("\n<|im_start|>tool\n5<|im_end|>") or obs.startswith("<|im_start|>tool\n5<|im_end|>")
    assert obs.endswith("<|im_start|>assistant\n")
    assert trace.info["tool_calls"] == [{"name": "add", "arguments": {"a": 2, "b": 3}, "ok": True,
                                         "seconds": trace.info["tool_calls"][0]["seconds"], "error": None, "turn": 1}]
    assert template.prompt_ids(trace.messages[:1], tools=schemas) == trace.segments[0].token_ids


@pytest.mark.parametrize("bad, says", [
    ("<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1", "not closed"),
    ("<tool_call>\n{name: add}\n</tool_call>", "not valid JSON"),
    (tool_call_text("subtract", a=1, b=2), "no tool named 'subtract'"),
    (tool_call_text("add", a=1), "missing"),
    (tool_call_text("add", a=1, b=2, c=3), "unknown argument"),
    (tool_call_text("explode", reason="boom"), "RuntimeError: boom"),
])
def test_a_bad_call_becomes_an_error_observation_not_a_crash(bad, says):
    agent, _ = scripted_tool_agent([bad, "done"])
    reply, trace = converse(agent)
    assert reply == "done"
    result = trace.messages[2]
    assert result["role"] == "tool" and result["content"].startswith("Error:") and says in result["content"]
    (record,) = trace.info["tool_calls"]
    assert record["ok"] is False and says in record["error"]


def test_calls_past_the_per_reply_limit_are_not_run():
    calls = "\n".join(tool_call_text("add", a=i, b=0) for i in range(5))
    agent, _ = scripted_tool_agent([calls, "done"], max_tool_calls_per_reply=3)
    _, trace = converse(agent)
    results = [m["content"] for m in trace.messages if m["role"] == "tool"]
    assert results[:3] == ["0", "1", "2"]
    assert all("at most 3 tool calls" in r for r in results[3:]) and len(results) == 5


def test_a_seat_that_never_stops_calling_is_cut_after_max_tool_rounds():
    forever = tool_call_text("add", a=1, b=1)
    agent, said = scripted_tool_agent([forever], max_tool_rounds=3)
    reply, trace = converse(agent)
    assert reply == forever  # returned unrun: the env decides what an unfinished reply means
    assert len(trace.info["tool_calls"]) == 3 and trace.info["tool_rounds_exhausted"] == 1
    assert len(said) == 4


def test_tools_need_the_tools_harness():
    agent = mrl.make_agent(mrl.AgentConfig(model="scripted", policy=lambda turn: "hi"))
    with pytest.raises(ValueError, match="harness = {id = 'tools'}"):
        converse(agent)


def test_echo_trains_on_tool_results_after_the_first_action():
    agent, _ = scripted_tool_agent([tool_call_text("add", a=2, b=3), "It is 5."])
    _, trace = converse(agent)
    trace.role = "agent"
    build_algorithm({"type": "echo", "alpha": 0.5}).write(trace, advantage=1.0)
    weights = trace.streams.ce_weights
    kinds = trace.token_kinds
    assert len(weights) == len(kinds)
    assert [w for w, k in zip(weights, kinds) if k == "observation"] == [0.5] * kinds.count("observation")
    assert all(w == 0.0 for w, k in zip(weights, kinds) if k != "observation")


def test_parse_tool_calls_reads_arguments_given_as_a_json_string():
    (call,) = parse_tool_calls('<tool_call>{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}</tool_call>')
    assert call.name == "add" and call.arguments == {"a": 1, "b": 2} and call.error is None


def test_parse_tool_calls_reads_a_json_list_of_calls_in_one_block():
    """The APIGen format (one block, a list of calls): each element is a call; one bad element is an error call
    and does not hide the good ones."""
    calls = parse_tool_calls('<tool_call>[{"name": "add", "arguments": {"a": 1, "b": 2}}, 7, '
                             '{"name": "ls"}]</tool_call>')
    assert [(c.name, c.arguments, c.error is None) for c in calls] == [
        ("add", {"a": 1, "b": 2}, True), ("", {}, False), ("ls", {}, True)]
    assert "right shape" in calls[1].error
    (empty,) = parse_tool_calls("<tool_call>[]</tool_call>")
    assert empty.error and "right shape" in empty.error
