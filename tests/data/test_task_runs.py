"""The recipe reads any data format with named fields."""
from workbench.config import RunConfig
from workbench.recipes.train import run


def test_a_run_on_a_csv_with_its_own_field_names(tmp_path):
    rows = [("the soup was " + w, y) for w, y in (("cold", 0), ("lovely", 1), ("bland", 0),
                                                   ("perfect", 1))] * 5
    (tmp_path / "train.csv").write_text("stars,review\n" + "".join(f"{y},{t}\n" for t, y in rows))
    cfg = RunConfig(data=str(tmp_path / "train.csv"), text_field="review", label_field="stars",
                    steps=2, batch_size=4, telemetry=False, sample_hz=0)
    rec = run(cfg, progress=False)
    assert rec.status == "done" and len(rec.steps) == 2
    assert [e["examples"] for e in rec.evals] == [2, 2]  # rows 10 and 20 are the dev split
