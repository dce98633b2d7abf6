"""A 30-second soak: trainer + maker + logged bank on a 2-worker LocalCluster.

Longer ones, with these checks printed as PASS/FAIL: ``python benchmarks/soak.py --minutes 30``. In 30 s a
run here made 2,100-2,700 trainer steps, 44-50 maker rounds and 47 memory samples (second-half growth
0.4-0.7 %), well above the bounds below; snapshots every 4 s give seven.
"""

from __future__ import annotations

import json
import pathlib

import pytest


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_soak_loses_nothing_and_memory_stays_flat(tmp_path: pathlib.Path,
                                                             artifacts_dir: pathlib.Path) -> None:
    from benchmarks.soak import report, run

    fig = run(0.5, snapshot_every=4.0, sample_every=0.6, workdir=tmp_path)
    (artifacts_dir / "soak.json").write_text(json.dumps(fig, indent=2))
    print(report(fig))
    assert fig["steps"] > 100 and fig["maker_rounds"] >= 2
    assert fig["writes_acknowledged"] > 100 and fig["keys_checked"] >= 4096
    assert fig["lost"] == 0 and fig["lost_after_restore"] == 0  # every acknowledged write is in the bank
    assert fig["snapshots"] >= 4
    assert fig["rss_samples"] >= 20
    assert fig["rss_growth_second_half"] < 0.10  # workers' memory flat over the second half
