"""Each lesson and each lab experiment says which model it is for, and its page or link selects it.

The pot-is-memory-bound ones (the plan's "Two pots" and "More tables"; the Roofline, KV-cache and
Smaller-portions labs) are for the assistant, the rest for the chef. A lab page opens on its model the
first time a session visits it (a shared `?model=` link wins) and says why in one line; the learner's
pick in the sidebar stands after that. A lesson link selects its model. When the assistant is not
fetched yet, the lesson and the lab page say in one line that it is being fetched instead of failing.
"""

from __future__ import annotations

from streamlit.testing.v1 import AppTest

from kitchen_viz.lessons import LESSONS, query
from kitchen_viz.model_pick import KEY_OPENED, model_line, page_model
from lab.model_for import ASSISTANT, CHEF
from lab.registry import EXPERIMENTS, experiment
from tests.app_kit import APP, lab_page_test
from tests.test_fetch_progress import empty_cache  # noqa: F401  (a fixture)

MEMORY_BOUND_LESSONS = {"Two pots, one order", "More tables, same ladle"}
MEMORY_BOUND_LABS = {"roofline", "kv_cache", "portions"}


def test_the_memory_bound_lessons_are_for_the_assistant_and_the_instant_ones_for_the_chef():
    for lesson in LESSONS:
        assert lesson.model == (ASSISTANT if lesson.title in MEMORY_BOUND_LESSONS else CHEF), lesson.title
        for i, order in ((1, lesson.order), (101, lesson.compare_with)):
            if order is not None:  # both of a lesson's orders cook on its model
                assert query(order, i, lesson.model)["model"] == lesson.model.name
    assert {lesson.title for lesson in LESSONS} >= MEMORY_BOUND_LESSONS


def test_the_memory_bound_experiments_are_for_the_assistant_and_the_rest_for_the_chef():
    assert {e.key for e in EXPERIMENTS} >= MEMORY_BOUND_LABS
    for e in EXPERIMENTS:
        assert e.model == (ASSISTANT if e.key in MEMORY_BOUND_LABS else CHEF), e.key
        assert page_model(e.url_path) == e.model
    assert page_model("kitchen") is None


def test_the_lab_pages_line_names_the_model_and_why():
    names = ["chef", "assistant"]
    assert model_line(ASSISTANT, "assistant", names) == (
        "Runs on the assistant by default: its weights are far bigger than the CPU's cache, so the soup pot reads "
        "all of them from memory at every step, as in the story. Pick another model in the sidebar to compare."
    )
    assert model_line(ASSISTANT, "chef", names).endswith("; it runs on chef now, as picked in the sidebar.")
    assert model_line(ASSISTANT, "chef", ["chef"]).endswith("which this server's catalog does not offer.")


PICK = """
import streamlit as st
from kitchen_viz.app_state import KEY_MODEL
from kitchen_viz.model_pick import pick_for_page
st.session_state.setdefault(KEY_MODEL, "chef")
pick_for_page(st.session_state.get("page", "lab_roofline"), ["chef", "apprentice", "assistant"])
st.session_state["tpk_url_seeded"] = True  # as app_state.seed_from_url marks the link read
st.write(st.session_state[KEY_MODEL])
"""


def picked(at: AppTest, page: str) -> str:
    at.session_state["page"] = page
    at.run()
    assert not at.exception, at.exception
    return at.markdown[-1].value


def test_a_lab_page_picks_its_model_on_the_first_visit_then_the_learners_pick_stands():
    at = AppTest.from_string(PICK)
    assert picked(at, "lab_padding") == "chef"
    assert picked(at, "lab_roofline") == "assistant"  # the first visit: its experiment's model
    at.session_state["tpk_model"] = "chef"  # the learner picks the chef in the sidebar
    assert picked(at, "lab_roofline") == "chef"  # ... and it stands
    assert picked(at, "lab_kv_cache") == "assistant"  # another memory-bound page, first visit
    assert at.session_state[KEY_OPENED] == ["lab_padding", "lab_roofline", "lab_kv_cache"]


def test_a_shared_link_naming_a_model_wins_over_the_pages_own():
    at = AppTest.from_string(PICK)
    at.query_params["model"] = "apprentice"
    at.session_state["tpk_model"] = "apprentice"  # what seed_from_url takes from the link
    assert picked(at, "lab_roofline") == "apprentice"


def test_a_lesson_link_selects_its_model_once_per_lesson():
    at = AppTest.from_string(PICK)
    at.query_params.update(query(LESSONS[0].order, 1, LESSONS[0].model))
    assert picked(at, "kitchen") == "assistant"
    at.session_state["tpk_model"] = "chef"  # the learner changes it: the same link does not undo that
    assert picked(at, "kitchen") == "chef"
    at.query_params.update(query(LESSONS[3].order, 4, LESSONS[3].model))  # the next lesson, on the chef
    assert picked(at, "kitchen") == "chef"
    at.query_params.update(query(LESSONS[2].order, 3, LESSONS[2].model))  # More tables: the assistant again
    assert picked(at, "kitchen") == "assistant"


def test_a_lab_page_says_which_model_it_is_for_in_one_line():
    at = lab_page_test("roofline", 120).run()  # drawn without the sidebar: the catalog's default, the chef
    assert not at.exception, at.exception
    line = next(c.value for c in at.caption if "This experiment is for the assistant" in c.value)
    assert line.endswith("it runs on chef now, as picked in the sidebar.")


def test_a_lesson_on_the_assistant_not_yet_fetched_says_so_in_one_line(empty_cache):  # noqa: F811
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params.update(query(LESSONS[0].order, 1, LESSONS[0].model))
    at.run()
    assert not at.exception, at.exception
    assert at.session_state["tpk_model"] == "assistant"
    assert "being fetched for its first use" in at.info[0].value


def test_a_lab_page_on_the_assistant_not_yet_fetched_says_so_in_one_line(empty_cache):  # noqa: F811
    script = ("import streamlit as st\nfrom kitchen_viz.lab_page_kit import render_experiment\n"
              "from lab.registry import experiment\nst.session_state['tpk_model'] = 'assistant'\n"
              "render_experiment(experiment('roofline'))\n")  # fmt: skip
    at = AppTest.from_string(script, default_timeout=120).run()
    assert not at.exception, at.exception
    assert [i.value for i in at.info] == [
        "This model (assistant) is being fetched for its first use; the sidebar shows how far along it is. This "
        "page opens by itself when it is ready."
    ]
    assert "Runs on the assistant by default" in at.caption[0].value
    assert experiment("roofline").model == ASSISTANT
