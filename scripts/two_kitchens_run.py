"""Two kitchens on the chef, as JSON: the runs of serving/two_kitchens.py and whether each equals one kitchen.

    .venv/bin/python scripts/two_kitchens_run.py

Each run's transfer is compared with the link's prediction (latency + bytes / bandwidth, fitted to
probe messages of 4 KB .. 16 MB): `ratio` = measured / predicted, and `within_2x` says whether it
is between 0.5 and 2.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine import Engine  # noqa: E402
from serving.two_kitchens import run_two_kitchens  # noqa: E402

PROMPTS = [
    "ROMEO:",
    "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?\nDeny thy father and refuse thy name;",
    "KING HENRY:\nOnce more unto the breach, dear friends, once more;\nOr close the wall up with our English dead.\n"
    "In peace there's nothing so becomes a man\nAs modest stillness and humility:\n" * 3,
]


def main() -> int:
    runs, link = run_two_kitchens("chef", PROMPTS, max_new_tokens=32)
    single = Engine.load("chef")
    out = {"link": asdict(link), "runs": []}
    for run, prompt in zip(runs, PROMPTS, strict=True):
        same = run.tokens == single.generate([prompt], max_new_tokens=32).tokens[0]
        ratio = run.transfer_s / run.predicted_transfer_s
        out["runs"].append(asdict(run) | {"same_tokens": same, "ratio": ratio, "within_2x": 0.5 <= ratio <= 2})
    out["link"]["probes"] = {str(k): v for k, v in link.probes.items()}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
