"""Where a notebook's runs go: the command line's ``runs/`` at the checkout's root when it runs
from the checkout's ``notebooks/`` folder, else under its working directory."""
from pathlib import Path

from workbench.ui.notebook import runs_dir

ROOT = Path(__file__).resolve().parents[2]


def test_a_notebook_of_the_checkout_writes_to_the_checkouts_runs():
    assert runs_dir("01_quickstart", ROOT / "notebooks") == ROOT / "runs" / "01_quickstart"


def test_elsewhere_runs_go_under_the_working_directory(tmp_path):
    assert runs_dir("01_quickstart", tmp_path) == tmp_path / "runs" / "01_quickstart"
    (tmp_path / "notebooks").mkdir()  # a folder of that name, not in a checkout
    assert runs_dir("x", tmp_path / "notebooks") == tmp_path / "notebooks" / "runs" / "x"


def test_every_notebook_puts_its_runs_where_the_cli_does():
    """Each notebook takes its runs folder from ``setup`` (``runs_dir``): notebook 11 wrote to
    notebooks/runs/ with a Path("runs") of its own."""
    import nbformat

    for path in sorted((ROOT / "notebooks").glob("[0-9]*.ipynb")):
        code = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells
                         if c.cell_type == "code")
        assert f'setup("{path.stem}"' in code, path.name
        assert 'Path("runs")' not in code, path.name


def test_step_lines_print_a_runs_progress(capsys):
    """What notebooks 11 and 12 show while they train (a tiny run, a line per step here)."""
    from workbench.config import RunConfig
    from workbench.ui.notebook import run_with_lines

    cfg = RunConfig(model="tiny-opt", data="synthetic", steps=3, batch_size=2, seq_len=16,
                    sample_hz=0.0)
    rec = run_with_lines(cfg, None, "MeZO", every_s=0.0)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "MeZO: training 3 steps of mezo on tiny-opt ..."
    assert [line.split(",")[0] for line in out[1:]] == [f"MeZO: step {i} of 3"
                                                        for i in (1, 2, 3)]
    assert out[-1].startswith(f"MeZO: step 3 of 3, loss {rec.steps[-1]['loss']:.4g}, ")
