"""scripts/lab_record.py end to end on one quick experiment: files written, numbers from the run."""

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from proc_kit import run

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(
    not Path("/usr/bin/chromium").exists() and not shutil.which("chromium"), reason="no Chromium"
)
def test_recording_writes_charts_tables_and_findings(tmp_path):
    out = tmp_path / "rec"
    # Any failure shows the recorder's stderr; a chart Chromium did not draw fails the recording there
    # with the charts' names and kaleido's errors (lab.export.PngExportError), not a missing file here.
    run([sys.executable, str(REPO / "scripts" / "lab_record.py"), "--only", "padding", "--threads", "1",
         "--out", str(out)], timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})  # fmt: skip
    report = json.loads((out / "results.json").read_text())
    assert report["machine"]["torch_threads"] == 1 and report["machine"]["model"] == "chef"
    padding = report["experiments"]["padding"]
    assert padding["charts"] == ["padding-1.png", "padding-2.png"]
    for name in padding["charts"]:
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    assert "the wok is the bottleneck" in padding["inspector"]["headline"]
    rows = (out / "padding.csv").read_text().splitlines()
    assert rows[0].startswith("mode,tokens,slots") and len(rows) == 3
    summary = (out / "summary.md").read_text()
    assert "## padding" in summary and "68% of the wok idle" in summary  # 1384 of 2048 slots, by construction
