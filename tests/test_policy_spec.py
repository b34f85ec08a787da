"""One syntax for a policy and its options (app/scheduling/policy_spec.py):
the daemon's POLICY / POLICY_OPTIONS and the simulator's `--policy` read
`key=value,…` and JSON alike, to the same options."""

from __future__ import annotations

import pytest

from app.scheduling.policy_spec import format_options, parse_options, parse_policy
from app.server.settings import read_settings
from bench import simulate
from bench.cli import UsageError

KNOWN = ["symphony", "triton"]


@pytest.mark.parametrize(
    "text",
    [
        "stagger_slack=2,pruning=prefix,work=true,cap=none,f=1.5",
        '{"stagger_slack": 2, "pruning": "prefix", "work": true, "cap": null, "f": 1.5}',
    ],
)
def test_both_option_forms_give_the_same_options(text):
    assert parse_options(text) == {
        "stagger_slack": 2,
        "pruning": "prefix",
        "work": True,
        "cap": None,
        "f": 1.5,
    }


def test_a_policy_with_options_in_either_form_is_one_policy():
    kv = parse_policy("symphony:stagger_slack=2,pruning=prefix")
    js = parse_policy('symphony:{"stagger_slack": 2, "pruning": "prefix"}')
    assert kv == js
    assert kv.label == "symphony:stagger_slack=2,pruning=prefix"
    assert parse_policy("symphony").options == {}


def test_options_that_key_value_cannot_carry_are_shown_as_json():
    assert format_options({"sizes": [1, 2]}) == '{"sizes": [1, 2]}'
    assert parse_options(format_options({"sizes": [1, 2]})) == {"sizes": [1, 2]}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a=1,a=2", "given twice"),
        ("a", "key=value"),
        ("1a=2", "key=value"),
        ("{nope", "not JSON"),
        ("[1, 2]", "must be a JSON object"),
    ],
)
def test_bad_options_are_refused_with_the_reason(text, message):
    with pytest.raises(ValueError, match=message):
        parse_options(text)


@pytest.mark.parametrize(
    "env",
    [
        {"POLICY": "symphony", "POLICY_OPTIONS": '{"stagger_slack": 2}'},
        {"POLICY": "symphony", "POLICY_OPTIONS": "stagger_slack=2"},
        {"POLICY": "symphony:stagger_slack=2"},
        {"POLICY": 'symphony:{"stagger_slack": 2}'},
    ],
)
def test_the_daemon_reads_every_form_to_the_same_settings(env):
    settings = read_settings(env)
    assert settings.policy == "symphony"
    assert settings.policy_options == {"stagger_slack": 2}


def test_the_daemons_flags_read_the_same_forms():
    settings = read_settings({}, {"policy": "symphony:stagger_slack=2"})
    assert (settings.policy, settings.policy_options) == ("symphony", {"stagger_slack": 2})
    settings = read_settings({"POLICY": "flex"}, {"policy_options": "threshold=3.5"})
    assert (settings.policy, settings.policy_options) == ("flex", {"threshold": 3.5})
    with pytest.raises(ValueError, match="--policy and POLICY_OPTIONS"):
        read_settings({"POLICY_OPTIONS": "stagger_slack=1"}, {"policy": "symphony:stagger_slack=2"})


def test_the_daemon_refuses_an_option_given_twice_and_an_unknown_one():
    with pytest.raises(ValueError, match="'stagger_slack' given twice"):
        read_settings({"POLICY": "symphony:stagger_slack=2", "POLICY_OPTIONS": "stagger_slack=3"})
    with pytest.raises(ValueError, match="has no option 'nope'"):
        read_settings({"POLICY": "symphony:nope=1"})
    with pytest.raises(ValueError, match="is not a policy"):
        read_settings({"POLICY": "symphonx:stagger_slack=2"})


def test_the_simulator_reads_the_daemons_forms_to_the_same_policy():
    kv = simulate.parse_policy("triton:max_queue_delay_ms=2", KNOWN)
    js = simulate.parse_policy('triton:{"max_queue_delay_ms": 2}', KNOWN)
    assert kv == js
    assert (kv.name, kv.params, kv.label) == (
        "triton",
        {"max_queue_delay_ms": 2},
        "triton:max_queue_delay_ms=2",
    )
    daemon = read_settings({"POLICY": "triton", "POLICY_OPTIONS": '{"max_queue_delay_ms": 2}'})
    assert (daemon.policy, daemon.policy_options) == (kv.name, kv.params)
    with pytest.raises(UsageError, match="unknown policy"):
        simulate.parse_policy("clockwerk:a=1", KNOWN)
