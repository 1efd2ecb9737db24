"""The README's promise: the shipped quickstart reaches validation accuracy >= 0.97 on real data.

Runs the unmodified configs/quickstart.yaml (30 epochs over scikit-learn's 1,797 digits) through the
CLI, as `make quickstart` does; about a minute on 2 cores.
"""

from __future__ import annotations

import pytest

from conftest import REPO, read_metrics
from framer_ds.cli.main import main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_quickstart_reaches_097_accuracy(tmp_path, capsys):
    run = tmp_path / "quickstart"
    assert main(["train", str(REPO / "configs" / "quickstart.yaml"), f"output_dir={run}"]) == 0
    final_eval = read_metrics(run)[1][-1]
    assert final_eval["step"] == 1320  # 30 epochs x 44 steps: the shipped schedule ran to the end
    assert final_eval["eval/accuracy"] >= 0.97, final_eval
    assert "done: 1320 steps" in capsys.readouterr().out
