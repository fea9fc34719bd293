"""`rlt bench`: every subcommand's help, and one tiny offline run (CPU, a few seconds)."""

import json
import subprocess
import sys

import pytest

from rlt.cli import main

SUBCOMMANDS = ("offline", "serve", "prefix", "first-use")


def test_bench_help_lists_every_subcommand():
    r = subprocess.run([sys.executable, "-m", "rlt", "bench", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert all(name in r.stdout for name in SUBCOMMANDS)


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_bench_subcommand_help(name, capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", name, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: rlt bench {name}") and "--model" in out and "--device" in out


def test_bench_offline_tiny_run(checkpoints, tmp_path, capsys):
    out = tmp_path / "offline.json"
    argv = ["bench", "offline", "--model", checkpoints["ouro"], "--concurrency", "2", "--threshold", "1.0,0.5"]
    argv += ["--prompt-len", "8", "--max-tokens", "4", "--prefill-lens", "16", "--json-out", str(out)]
    assert main(argv + ["--exit-wait-passes", "0,2"]) == 0
    result = json.loads(out.read_text())
    rows = result["rows"]  # one engine per --exit-wait-passes value
    assert [(r["concurrency"], r["threshold"], r["exit_wait_passes"]) for r in rows] == [
        (2, 1.0, 0),
        (2, 0.5, 0),
        (2, 1.0, 2),
        (2, 0.5, 2),
    ]
    assert all(r["output_tokens"] == 2 * 4 and r["tok_per_s"] > 0 for r in rows)
    assert all((r["compiles"], r["captures"]) == (0, 0) for r in rows)  # (the CPU builds neither)
    assert rows[0]["mean_decode_depth"] == 4.0  # threshold 1.0: the full depth
    assert [p["prompt_len"] for p in result["prefill"]] == [16] and result["prefill"][0]["ms"] > 0
    assert result["meta"]["family"] == "ouro" and result["meta"]["device"] == "cpu"
    assert "prefill     16 tokens" in capsys.readouterr().out


def test_bench_offline_rows_per_prompt_length_skip_what_the_pool_cannot_hold(checkpoints, tmp_path, capsys):
    """--prompt-len takes a list (one engine each, rows carry it); a (concurrency, prompt length)
    whose sequences the pool cannot hold at once is named and not run, the others are."""
    out = tmp_path / "offline.json"
    argv = ["bench", "offline", "--model", checkpoints["ouro"], "--concurrency", "2,16", "--threshold", "1.0"]
    argv += ["--prompt-len", "8,40", "--max-tokens", "4", "--kv-gib", "0.001", "--json-out", str(out)]
    assert main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["concurrency"], r["prompt_len"]) for r in rows] == [(2, 8), (16, 8), (2, 40)]
    assert "cannot hold them at once): concurrency 16 at a 40-token prompt" in capsys.readouterr().out
