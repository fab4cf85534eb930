"""How long a new user waits for the assistant's first answer, measured the way they meet it.

A new user runs the README's command (the launcher `scripts/run.sh` execs, `two-pot-kitchen`) with
an empty model cache, opens the page, picks the assistant in the sidebar and presses Cook on the
question the form offers. Then they close the app and start it again (the model now cached), pick
the assistant and Cook again. This script does exactly that in headless Chromium and prints, for
each launch, the seconds from choosing the assistant to the finished Cook (the answer on the page),
with the seconds from launch, and the answer itself.

The first launch's clock includes whatever of the fetch (pip download, sha256, conversion to
safetensors) is still running when the assistant is chosen: the launcher starts the fetch in the
background at launch, and the script chooses the assistant as soon as the page is up, so nearly all
of it counts. `--no-prefetch` turns the launcher's fetch off: then choosing the assistant starts it.

    .venv/bin/python scripts/first_cook.py                      # pip as configured (PyPI here)
    .venv/bin/python scripts/first_cook.py --wheels ~/.cache/two-pot-kitchen/wheels   # no network
    .venv/bin/python scripts/first_cook.py --json docs/benchmarks/first-cook.json
    .venv/bin/python scripts/first_cook.py --runs 3 --wheels ~/.cache/two-pot-kitchen/wheels   # three pairs

Targets (the assistant's doc): under 60 s on the first launch, 5 s after a restart, on a 2-core laptop.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine import model_store  # noqa: E402
from kitchen_viz.launch import PREFETCH_ENV, free_port, spawn, stop, wait_healthy  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
MODEL_BOX = "Model (from the catalog)"
ASSISTANT_OPTION = "Assistant"  # the catalog label's start
TEMPLATE_LINE = "from the assistant's chat template"  # the order form's prompt length, on the assistant
TIMEOUT_MS = 600_000


@dataclass(frozen=True)
class Cook:
    """One launch: seconds from launch to the page, from choosing the assistant to the finished Cook."""

    launch: str  # "run N: first (empty model cache)" or "run N: after a restart"
    page_s: float  # launch -> the Kitchen's Cook button (the chef, the default model)
    choose_to_answer_s: float  # the assistant chosen in the sidebar -> its answer on the page
    choose_to_form_s: float  # of which: the assistant chosen -> its order form (fetched, loaded, checked)
    launch_to_answer_s: float
    prompt_line: str  # the form's count of the prompt's tokens
    answer: str
    load_1min: float  # the machine's load average as the Cook finished
    fetched_after_s: float | None  # launch -> the converted model in the cache (None: it was there)


def first_cook(url: str, launched: float, launch: str, fetched_after_s) -> Cook:
    from playwright.sync_api import sync_playwright  # lazy: --help and imports of this module need no browser

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1200})
            page.goto(url + "/")
            page.get_by_role("button", name="Cook").wait_for(timeout=TIMEOUT_MS)
            page_s = time.monotonic() - launched
            page.get_by_role("combobox", name=MODEL_BOX).click()
            page.get_by_role("option", name=ASSISTANT_OPTION, exact=False).first.click()
            chosen = time.monotonic()
            line = page.get_by_text(TEMPLATE_LINE)
            line.wait_for(timeout=TIMEOUT_MS)  # the assistant's order form: fetched, loaded, its prompt checked
            form = time.monotonic()
            page.get_by_role("button", name="Cook").click()
            page.get_by_text("Full text, table by table").wait_for(timeout=TIMEOUT_MS)
            done = time.monotonic()
            page.get_by_text("Full text, table by table").click()
            answer = page.locator('[data-testid="stCode"] code').first
            answer.wait_for(timeout=30_000)
            return Cook(launch, round(page_s, 1), round(done - chosen, 1), round(form - chosen, 1), round(done - launched, 1),
                        line.inner_text(), answer.inner_text().strip(), os.getloadavg()[0], fetched_after_s())  # fmt: skip
        finally:
            browser.close()


def launch_and_cook(log: Path, launch: str) -> Cook:
    config = model_store.folder_of("assistant") / "config.json"  # written last: the model is whole
    was_cached, wall = config.is_file(), time.time()
    launched = time.monotonic()
    proc, url = spawn(free_port(), log)
    try:
        if not wait_healthy(proc, url, timeout_s=300):
            raise SystemExit(f"the app never became healthy; its log: {log}")
        return first_cook(url, launched, launch, lambda: None if was_cached else round(config.stat().st_mtime - wall, 1))
    finally:
        stop(proc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--wheels", metavar="DIR", help="pip takes the wheel from DIR only (no index)")
    parser.add_argument("--no-prefetch", action="store_true", help="the launcher does not fetch at launch")
    parser.add_argument("--runs", type=int, default=1, help="launch pairs (first, restart), each from an empty cache")
    parser.add_argument("--json", metavar="FILE", help="also write the figures to FILE")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="first-cook-") as tmp:
        os.environ.update({"TWO_POT_MODEL_CACHE": str(Path(tmp) / "models"),
                           PREFETCH_ENV: "0" if args.no_prefetch else "1", "TOKENIZERS_PARALLELISM": "false"})  # fmt: skip
        if args.wheels:
            os.environ.update({"PIP_FIND_LINKS": str(Path(args.wheels).expanduser()), "PIP_NO_INDEX": "1"})
        cooks = []
        for run in range(1, args.runs + 1):
            shutil.rmtree(Path(tmp) / "models", ignore_errors=True)  # each run starts with an empty model cache
            cooks += [launch_and_cook(Path(tmp) / f"first-{run}.log", f"run {run}: first (empty model cache)"),
                      launch_and_cook(Path(tmp) / f"again-{run}.log", f"run {run}: after a restart")]  # fmt: skip
    conditions = {"cores": os.cpu_count(), "pip": f"--find-links {args.wheels} --no-index" if args.wheels
                  else "as configured", "pip_cache": "off" if os.environ.get("PIP_NO_CACHE_DIR") else "as configured",
                  "prefetch": not args.no_prefetch}  # fmt: skip
    for c in cooks:
        print(f"{c.launch}: {c.choose_to_answer_s:.1f} s from choosing the assistant to its answer "
              f"({c.choose_to_form_s:.1f} s to its order form; {c.launch_to_answer_s:.1f} s from launch; the page after {c.page_s:.1f} s; the model cached after "
              f"{c.fetched_after_s if c.fetched_after_s is not None else '-'} s; load {c.load_1min:.1f})")  # fmt: skip
        answer = " ".join(c.answer.split())
        print(f"  {c.prompt_line}")
        print(f"  answer: {answer[:160]}")
    print(f"conditions: {conditions}")
    if args.json:
        Path(args.json).write_text(json.dumps({"conditions": conditions, "cooks": [asdict(c) for c in cooks]}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
