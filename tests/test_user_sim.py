"""The simulated-user environment: hidden scenarios, personas, the done marker, the success check."""

import random

import pytest

import multiagent_rl as mrl
from multiagent_rl.config import ExperimentConfig
from multiagent_rl.envs.user_sim import (ASSISTANT_SYSTEM, user_conduct, PERSONAS, UserSimEnv, careful_assistant, hasty_assistant,
                                         scripted_user, user_system_prompt)
from multiagent_rl.envs.user_sim.booking import (Goal, all_goals, booking_text, latest_values, menu, mentions, parse_booking,
                                         split_goals)

GOAL = Goal("Oslo", "May 3", 2)


def scripted(policy):
    return mrl.make_agent(mrl.AgentConfig(model="scripted", policy=policy, sampling={"max_new_tokens": 128}))


def play(env, assistant_policy, tasks, user_policy=None):
    agents = {"user": scripted(user_policy or scripted_user()), "assistant": scripted(assistant_policy)}
    return mrl.run_sync(mrl.play_episodes(env, tasks, agents, seed="0", trainable={"user": False, "assistant": True}))


def one(env, persona, assistant_policy, goal=GOAL, **kw):
    (ep,) = play(env, assistant_policy, [env.scenario(goal, persona, seed=1)], **kw)
    assert ep.ok, ep.errors
    return ep.by_role("user")[0], ep.by_role("assistant")[0]


@pytest.mark.parametrize("menu_mode", [False, True])
@pytest.mark.parametrize("persona", PERSONAS)
def test_the_assistants_trace_never_contains_the_scenario(persona, menu_mode):
    env = UserSimEnv(menu=menu_mode)
    user, assistant = one(env, persona, careful_assistant())
    scenario = user_system_prompt(GOAL, persona)
    assert user.messages[0] == {"role": "system", "content": scenario}
    seen = " ".join(m["content"] for m in assistant.messages)
    assert "hidden goal" not in seen and "###DONE###" not in seen and persona not in seen
    assert assistant.messages[0] == {"role": "system", "content": ASSISTANT_SYSTEM}
    assert assistant.metrics["success"] == 1.0


def test_the_assistants_tokens_hold_only_its_own_conversation():
    env = UserSimEnv()
    user, assistant = one(env, "terse", careful_assistant())
    agent = mrl.make_agent(mrl.AgentConfig(model="scripted", policy=lambda turn: ""))
    text = agent.tokenizer.decode(assistant.token_ids)
    assert "hidden goal" not in text and "customer" not in text and "Which city?" in text


def test_personas_behave_as_described():
    env = UserSimEnv()
    terse, _ = one(env, "terse", careful_assistant())
    opening = terse.messages[2]["content"]
    assert opening == "I need a booking." and not any(mentions(opening).values())
    assert terse.messages[4]["content"] == "Oslo."  # answers only what was asked

    chatty, _ = one(env, "chatty", careful_assistant())
    said = mentions(chatty.messages[2]["content"])
    assert len(said["city"]) == 2 and said["city"][-1] == "Oslo" and said["date"] == ["May 3"] and said["seats"] == ["2"]

    confused, _ = one(env, "confused", careful_assistant())
    first, second = confused.messages[2]["content"], confused.messages[4]["content"]
    assert mentions(first)["seats"] == ["3"] and not mentions(first)["date"]
    assert second.startswith("Sorry, not 3 seats: 2 seats.") and latest_values([first, second])["seats"] == "2"

    adversarial, _ = one(env, "adversarial", careful_assistant())
    assert "right now" in adversarial.messages[2]["content"]
    assert adversarial.messages[4]["content"].endswith("Just book it already!")


def test_a_booking_ends_the_conversation_and_the_user_says_the_marker():
    env = UserSimEnv(done_marker="<<END>>")
    user, assistant = one(env, "chatty", careful_assistant())
    assert user.last_reply == "Perfect, thank you! <<END>>"
    assert assistant.metrics["user_turns"] == 2.0 and assistant.metrics["booked"] == 1.0


def test_the_done_marker_ends_the_conversation_without_a_booking():
    env = UserSimEnv()

    def quitter(turn):
        return "I give up. ###DONE###" if turn.state["assistant_said"] else "Hello."

    user, assistant = one(env, "terse", lambda turn: "Which city?", user_policy=quitter)
    assert len([m for m in assistant.messages if m["role"] == "assistant"]) == 1
    assert (assistant.metrics["success"], assistant.metrics["booked"], assistant.metrics["ended_without_success"]) == (
        0.0, 0.0, 1.0)


def test_max_turns_ends_a_conversation_that_never_books():
    env = UserSimEnv(max_turns=3)
    user, assistant = one(env, "terse", lambda turn: "Which city?")
    assert len([m for m in assistant.messages if m["role"] == "assistant"]) == 3
    assert assistant.metrics["user_turns"] == 4.0 and assistant.reward == 0.0
    assert assistant.metrics["ended_without_success"] == 1.0


@pytest.mark.parametrize("booking, success, slots", [
    ("BOOK city=Oslo date=May 3 seats=2", 1.0, 1.0),
    ("Here you go: BOOK city=Oslo date=May 3 seats=2", 1.0, 1.0),
    ("BOOK city=Oslo date=May 3 seats=3", 0.0, 2 / 3),
    ("BOOK city=Rome date=May 3 seats=2", 0.0, 2 / 3),
    ("BOOK city=Oslo date=any seats=2", 0.0, 0.0),  # not a booking of real values: nothing booked
    ("BOOK Oslo please", 0.0, 0.0),
])
def test_the_success_check_compares_every_slot_of_the_booking(booking, success, slots):
    env = UserSimEnv()
    _, assistant = one(env, "chatty", lambda turn: booking)
    assert assistant.metrics["success"] == success and assistant.reward == success
    assert assistant.metrics["slots_right"] == pytest.approx(slots)
    assert assistant.info["user_sim"]["goal"] == "BOOK city=Oslo date=May 3 seats=2"


@pytest.mark.parametrize("booking, partial", [
    ("BOOK city=Oslo date=May 3 seats=2", 0.0),  # right: the success reward alone
    ("BOOK city=Oslo date=any seats=2", 2 / 3),  # unreadable date: no booking, but two slots booked right
    ("Sure.\nBOOK city=Rome date=May 3 seats=any", 1 / 3),
    ("BOOK city=Lisbon date=June 40 seats=7", 0.0),  # no slot names a value
    ("I can help with that.", 0.0),
])
def test_partial_credit_rewards_each_slot_booked_right_when_the_booking_is_not(booking, partial):
    _, strict = one(UserSimEnv(), "chatty", lambda turn: booking)
    assert [r.name for r in strict.rewards] == ["success"]  # off by default: the reward is success alone
    _, shaped = one(UserSimEnv(partial_credit=0.5), "chatty", lambda turn: booking)
    success = strict.metrics["success"]
    assert shaped.metrics == strict.metrics  # the metrics (and held-out success) stay strict
    assert shaped.reward == pytest.approx(success + 0.5 * partial)
    with pytest.raises(ValueError, match="partial_credit"):
        UserSimEnv(partial_credit=2.0)


@pytest.mark.parametrize("opening, in_character", [
    ("I need a booking, please.", 1.0),
    ("I want to book 2 seats to Oslo on May 3.", 0.0),  # quotes its hidden goal as the prompt words it
    ("Hello! How can I help you today?", 0.0),  # talks as the assistant
])
@pytest.mark.parametrize("assistant, goal_met", [(careful_assistant(), 1.0), (lambda turn: "BOOK city=Rome date=May 3 "
                                                                                          "seats=2", 0.0)])
def test_a_trained_user_is_rewarded_for_keeping_to_its_part_and_getting_its_goal(opening, in_character, assistant,
                                                                                 goal_met):
    def user(turn):
        return opening if turn.state["assistant_said"] is None else scripted_user()(turn)

    untrained, _ = one(UserSimEnv(), "terse", assistant, user_policy=user)
    assert untrained.rewards == []  # without user_reward the user's trace has no reward
    trained, assistant_trace = one(UserSimEnv(user_reward=True), "terse", assistant, user_policy=user)
    assert {r.name: r.value for r in trained.rewards} == {"in_character": in_character, "goal_met": goal_met}
    assert assistant_trace.metrics["success"] == goal_met and trained.reward == in_character + goal_met


def test_the_careful_assistant_always_succeeds_and_the_hasty_one_rarely():
    for menu_mode in (False, True):
        env = UserSimEnv(menu=menu_mode)
        tasks = env.sample_tasks(80, random.Random(0))
        careful = [ep.by_role("assistant")[0].metrics["success"] for ep in play(env, careful_assistant(), tasks)]
        hasty = [ep.by_role("assistant")[0].metrics["success"] for ep in play(env, hasty_assistant(), tasks)]
        assert sum(careful) == len(tasks)
        assert sum(hasty) / len(tasks) < 0.25


def test_booking_helpers():
    assert parse_booking(booking_text(GOAL)) == GOAL and parse_booking("BOOK city=Oslo date=May 3 seats=9") is None
    choices = menu(["I loved Rome, but want Oslo, on May 3, for 2 seats."])
    assert choices[:3] == ["Which city?", "Which date?", "How many seats?"]
    assert set(choices[3:]) == {"BOOK city=Rome date=May 3 seats=2", "BOOK city=Oslo date=May 3 seats=2"}
    assert menu(["I need a booking."])[3:] == ["BOOK city=any date=any seats=any"]
    train, held_out = split_goals()
    assert not set(train) & set(held_out) and len(train) + len(held_out) == len(all_goals())


def test_the_user_seat_is_scripted_and_untrained_unless_bound():
    cfg = ExperimentConfig.model_validate({"env": [{"id": "user_sim"}]})
    user = cfg.env[0].roles["user"]
    assert user.model == "scripted" and user.trainable is False and "scripted_user" in user.policy
    cfg = ExperimentConfig.model_validate({"env": [{"id": "user_sim", "roles": {"user": {"model": "tiny"}}}]})
    assert cfg.env[0].roles["user"].model == "tiny"
    with pytest.raises(ValueError, match="personas"):
        UserSimEnv(personas=["grumpy"])


def test_user_conduct_flags_a_quoted_goal_and_an_assistant_voice_only():
    goal = Goal("Paris", "Monday", 2)
    # the hidden goal exactly as the user's system prompt words it
    assert f"book {goal.seats} seats to {goal.city} on {goal.date}" in user_system_prompt(goal, "terse")
    fine = user_conduct(["I need to get to Paris.", "Two of us, on Monday please."], goal)
    assert fine == {"leaked_goal": 0.0, "broke_character": 0.0}
    leaked = user_conduct(["Hi", "I want to Book 2 seats to Paris on Monday."], goal)
    assert leaked == {"leaked_goal": 1.0, "broke_character": 0.0}
    swapped = user_conduct(["Hello! How can I help you today?"], goal)
    assert swapped == {"leaked_goal": 0.0, "broke_character": 1.0}
    assert user_conduct(["BOOK city=Paris date=Monday seats=2"], goal)["broke_character"] == 1.0
