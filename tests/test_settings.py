"""The one reader of a run's settings (`Settings`, `LlmSettings`): ini values and options read once,
each with its default from one place."""

from __future__ import annotations

import pytest

from pytest_kope.agents.llm import openai_endpoint
from pytest_kope.agents.tuner.agent import EXPLORE_RATE
from pytest_kope.errors import ConfigError
from pytest_kope.settings import DEFAULTS, LlmSettings, ReviewSettings, Settings


def test_the_llm_agents_settings_come_from_the_ini_file_once(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_SERVER", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("MY_KEY", "k-123")
    monkeypatch.delenv("KOPE_MODEL", raising=False)
    pytester.makeini(
        "[pytest]\nkope_openai_key_env = MY_KEY\nkope_openai_base_url = MY_SERVER\n"
        "kope_model = qwen3-coder\nkope_max_tokens = 6000\nkope_llm_context = 32768\n"
    )
    llm = LlmSettings.from_config(pytester.parseconfig())
    assert (llm.model, llm.max_tokens, llm.context) == ("qwen3-coder", 6000, 32768)
    assert openai_endpoint(llm.openai_key_env, llm.openai_base_url) == ("k-123", "http://127.0.0.1:9/v1")


def test_the_model_falls_back_to_the_environment_and_the_option_wins(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KOPE_MODEL", "from-env")
    assert LlmSettings.from_config(pytester.parseconfig()).model == "from-env"
    assert LlmSettings.from_config(pytester.parseconfig("--kope-model", "given")).model == "given"


def test_a_token_limit_that_is_no_number_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nkope_max_tokens = plenty\n")
    said = "--kope-max-tokens whole numbers of tokens; got max_tokens='plenty'"
    with pytest.raises(ConfigError, match=said):
        LlmSettings.from_config(pytester.parseconfig())


def test_the_tuners_exploration_has_one_default() -> None:
    assert Settings().explore == EXPLORE_RATE == DEFAULTS["kope_explore"]


def test_the_exploration_share_is_read_with_the_run(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nkope_explore = 0.25\n")
    assert Settings.from_config(pytester.parseconfig()).explore == 0.25
    with pytest.raises(ConfigError, match="--kope-explore takes a share between 0 and 1, got 2"):
        Settings.from_config(pytester.parseconfig("--kope-explore", "2"))


def test_where_winners_go_is_read_once_with_its_defaults(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nkope_forge = gitlab\nkope_pr_base = develop\n")
    review = ReviewSettings.from_config(pytester.parseconfig("--kope-pr"))
    assert (review.pr, review.push, review.pr_base, review.peers) == (True, "origin", "develop", False)
    assert review.forge["kope_forge"] == "gitlab" and review.forge["kope_forge_url"] is None
    quiet = ReviewSettings.from_config(pytester.parseconfig())
    assert (quiet.pr, quiet.push) == (False, None)  # nothing pushed unless asked
