"""bench/step_chart.py draws bench/rl_step.py's step breakdown: every part a bar, the compute limit a line."""

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[3] / "bench"

FIGURES = {
    "episodes": 128,
    "step_tokens": 29563,
    "device": "cpu",
    "compute_limit_s": 1.2,
    "step_breakdown_s": {"rollout": 1.6, "logprobs": 0.6, "forward": 0.9, "backward": 1.3, "weight_sync": 0.02},
}


def test_the_chart_of_a_json_line_is_a_png(tmp_path):
    line = tmp_path / "rl_step.json"
    line.write_text("some log line\n" + json.dumps(FIGURES) + "\n")  # the bench's last line is its JSON
    out = tmp_path / "step.png"
    proc = subprocess.run([sys.executable, str(BENCH / "step_chart.py"), str(line), str(out)], capture_output=True)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5_000


def test_wrong_arguments_print_the_usage():
    proc = subprocess.run([sys.executable, str(BENCH / "step_chart.py")], capture_output=True, text=True)
    assert proc.returncode == 2 and "bench/rl_step.py" in proc.stderr
