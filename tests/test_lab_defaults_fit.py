"""Every lab experiment's default settings cook on every catalog model.

Why: on the GPU machine Big banquet's defaults failed on the chef (they asked for a 512-token
prompt, the chef's whole context, plus one new token). Defaults are what a class runs first and
what scripts record; they must fit the smallest context in the catalog.
"""

import pytest

from lab.banquet import BanquetSettings
from lab.kv_cache import KvSettings
from lab.metrics_defs import MetricsSettings
from lab.overhead import OverheadSettings
from lab.padding import PaddingSettings
from lab.roofline_lab import RooflineSettings
from lab.tables import TablesSettings
from serving.catalog import describe, load_catalog


def longest_order(settings) -> int:
    """Prompt + new tokens of the longest request the settings ask for."""
    prompts = [getattr(settings, f, 0) for f in ("prompt_len", "decode_prompt")]
    prompts += [max(getattr(settings, f, ()) or (0,)) for f in ("lengths", "prompt_lens")]
    return max(prompts) + max(1, getattr(settings, "new_tokens", 1))


@pytest.mark.parametrize(
    "settings",
    [BanquetSettings(), KvSettings(), MetricsSettings(), OverheadSettings(), PaddingSettings(), RooflineSettings(),
     TablesSettings()],  # fmt: skip
    ids=lambda s: type(s).__name__,
)
def test_defaults_fit_every_catalog_model(settings):
    smallest = min((describe(e).max_context, e.name) for e in load_catalog().entries)
    assert longest_order(settings) <= smallest[0], f"{type(settings).__name__} does not fit {smallest[1]}"
