"""Does work on the OTHER core slow the engine? The chef's batch-1 TPOT on core 1, with core 0 idle
or busy (ui-overhead.md, "Why the browser's work costs the engine even on the other core").

Five rounds; in each, one 128-token greedy order per neighbour, the neighbour pinned to core 0:
  idle    nothing started
  spin    a Python busy loop (no memory traffic)
  stream  summing a 64 MB array over and over (memory bandwidth)
  l2      summing a 512 KB array over and over (stays in core 0's own L2)

    HF_HUB_OFFLINE=1 .venv/bin/python docs/benchmarks/neighbour_probe.py
"""

import os
import statistics
import subprocess
import sys
import time

NEIGHBOURS = {
    "idle": None,
    "spin": "while True: pass",
    "stream": "import numpy as np\na = np.ones(64 * 1024 * 1024 // 8)\nwhile True: a.sum()",
    "l2": "import numpy as np\na = np.ones(512 * 1024 // 8)\nwhile True: a.sum()",
}


def main() -> None:
    os.sched_setaffinity(0, {1})
    import torch  # lazy: after the affinity above, so torch's threads inherit it

    from engine import Engine  # lazy: imports torch, as above

    torch.set_num_threads(1)
    engine = Engine.load("chef")
    prompt = [list(range(5, 37))]

    def tpot_ms() -> float:
        return engine.generate(prompt, max_new_tokens=128, stop_at_eos=False).metrics.tpot_s * 1e3

    tpot_ms()  # warm-up
    runs: dict[str, list[float]] = {name: [] for name in NEIGHBOURS}
    for _ in range(5):
        for name, code in NEIGHBOURS.items():
            proc = None
            if code:
                proc = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", code])
                time.sleep(0.5)
            runs[name].append(tpot_ms())
            if proc:
                proc.kill()
                proc.wait()
    for name, xs in runs.items():
        print(f"{name:7s} median {statistics.median(xs):.3f} ms  rounds {[round(x, 2) for x in xs]}")


if __name__ == "__main__":
    main()
