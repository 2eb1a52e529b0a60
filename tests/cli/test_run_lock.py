"""`rewardlens audit` into an `--out` another run holds: refused with the holder named, store untouched."""

from rewardlens.cli import main
from rewardlens.data import save_pairs
from tests.helpers.locks import held_by_another_process


def test_a_second_audit_into_the_same_out_refuses_naming_the_first(tiny_root, pairs, tmp_path, capsys):
    out, pairs_file = tmp_path / "out", save_pairs(pairs, tmp_path / "pairs.jsonl")
    argv = ["audit", str(tiny_root["gpt2"]), "--pairs", str(pairs_file), "--out", str(out), "--quiet",
            "--no-probes", "--no-concepts"]
    with held_by_another_process(out) as (first, started):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"pid {first.pid}" in err and started in err
        assert not (out / "results.sqlite").exists() and not (out / "report.html").exists()
    assert main(argv) == 0  # the killed holder's lock is taken over
    assert (out / "report.html").exists()
