"""Learning run (slow): a shortened Kuhn poker recipe must push the average policy well below uniform play."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "recipes"))


@pytest.mark.slow
def test_shortened_recipe_beats_uniform_play(tmp_path):
    import kuhn_poker

    summary = kuhn_poker.main(["--steps", "200", "--warmup-steps", "100", "--eval-every", "20",
                               "--output-dir", str(tmp_path)])
    uniform = 11 / 24
    assert summary["final_avg_exploitability"] < uniform - 0.1
    assert summary["final_invalid_reply_rate"] <= 0.05
    assert (tmp_path / "summary.json").exists() and (tmp_path / "exploitability.png").exists()
