"""`rlt bench`: every subcommand's help, and one tiny offline run (CPU, a few seconds)."""

import json
import re
import subprocess
import sys

import pytest

from rlt.cli import main
from rlt.models.checkpoint import make_checkpoint

SUBCOMMANDS = ("offline", "serve", "prefix", "first-use")
SUBCOMMANDS += ("profile", "grammar", "parity", "kv-handoff", "gemm")


def test_bench_help_lists_every_subcommand():
    r = subprocess.run(
        [sys.executable, "-m", "rlt", "bench", "--help"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert all(name in r.stdout for name in SUBCOMMANDS)


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_bench_subcommand_help(name, capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", name, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    # (kv-handoff: two pools; gemm: the families' shapes, no model)
    where = {"kv-handoff": ("--src", "--dst"), "gemm": ("--shapes", "--rows")}.get(
        name, ("--model", "--device")
    )
    assert out.startswith(f"usage: rlt bench {name}") and all(flag in out for flag in where)


def test_bench_offline_tiny_run(checkpoints, tmp_path, capsys):
    out = tmp_path / "offline.json"
    argv = [
        "bench",
        "offline",
        "--model",
        checkpoints["ouro"],
        "--concurrency",
        "2",
        "--threshold",
        "1.0,0.5",
    ]
    argv += [
        "--prompt-len",
        "8",
        "--max-tokens",
        "4",
        "--prefill-lens",
        "16",
        "--json-out",
        str(out),
    ]
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


def test_bench_offline_rows_per_prompt_length_skip_what_the_pool_cannot_hold(
    checkpoints, tmp_path, capsys
):
    """--prompt-len takes a list (one engine each, rows carry it); a (concurrency, prompt length)
    whose sequences the pool cannot hold at once is named and not run, the others are."""
    out = tmp_path / "offline.json"
    argv = [
        "bench",
        "offline",
        "--model",
        checkpoints["ouro"],
        "--concurrency",
        "2,16",
        "--threshold",
        "1.0",
    ]
    argv += [
        "--prompt-len",
        "8,40",
        "--max-tokens",
        "4",
        "--kv-gib",
        "0.001",
        "--json-out",
        str(out),
    ]
    assert main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["concurrency"], r["prompt_len"]) for r in rows] == [(2, 8), (16, 8), (2, 40)]
    assert (
        "cannot hold them at once): concurrency 16 at a 40-token prompt" in capsys.readouterr().out
    )


def test_bench_profile_tiny_run(checkpoints, tmp_path, capsys):
    """Host side only (no --gpu): cProfile's table over the decode steps and the JSON."""
    out = tmp_path / "profile.json"
    argv = ["bench", "profile", "--model", checkpoints["ouro"], "--device", "cpu"]
    argv += ["--concurrency", "2", "--prompt-len", "8", "--steps", "4", "--top", "3"]
    argv += ["--kv-gib", "0.01", "--json-out", str(out)]
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["concurrency"] == 2 and result["host_ms_per_step"] > 0
    assert result["engine"]["max_num_seqs"] == 2 and "gpu_busy_ms_per_step" not in result
    printed = capsys.readouterr().out
    assert "4 steps at concurrency 2:" in printed and "Ordered by: internal time" in printed


def test_bench_profile_of_speculation(tmp_path, capsys):
    """--speculative-loops: the steps run speculation rounds, counted with their acceptance (on a
    checkpoint whose loops barely change the state, drafts match)."""
    path = make_checkpoint("ouro", str(tmp_path / "ckpt"), seed=1, update_scale=0.001)
    out = tmp_path / "profile.json"
    argv = ["bench", "profile", "--model", path, "--device", "cpu", "--prompt-len", "8"]
    argv += ["--steps", "12", "--top", "3", "--kv-gib", "0.01", "--json-out", str(out)]
    assert main(argv + ["--speculative-loops", "1", "--speculative-tokens", "2"]) == 0
    result = json.loads(out.read_text())
    assert result["engine"]["speculative_loops"] == 1 and result["spec_rounds"] >= 1
    assert result["acceptance"] == 1.0
    assert f"speculation: {result['spec_rounds']} rounds, acceptance 1.0" in capsys.readouterr().out


def test_bench_profile_refuses_a_pool_too_small(checkpoints):
    argv = ["bench", "profile", "--model", checkpoints["ouro"], "--device", "cpu"]
    argv += ["--concurrency", "64"]
    with pytest.raises(SystemExit, match="raise --kv-gib"):
        main(argv + ["--prompt-len", "64", "--steps", "4", "--kv-gib", "0.0001"])


def test_bench_grammar_tiny_run(checkpoints, tmp_path):
    out = tmp_path / "grammar.json"
    argv = ["bench", "grammar", "--model", checkpoints["ouro"]]
    argv += ["--streams", "2", "--prompt-len", "8"]
    argv += ["--max-tokens", "12", "--neighbours", "2", "--arrival-ms", "5", "--ttft-reps", "2"]
    assert main(argv + ["--repeat", "1", "--json-out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [r["mean_len"] for r in result["free"]] == [12]  # (EOS ignored: every token)
    assert len(result["constrained"]) == 1 and result["decode_ratio"] > 0
    assert set(result["ttft_ms"]) == {"free", "cached"}
    assert [r["new_schemas"] for r in result["compile_stall"]] == [False, True]
    assert all(r["arrivals"] >= 1 and r["itl_p50_ms"] > 0 for r in result["compile_stall"])


def test_bench_parity_1p1d_matches_single(checkpoints, tmp_path):
    """On CPU, float32: 1p1d gives single's tokens and exit depths, one at a time and at once."""
    out = tmp_path / "parity.json"
    argv = ["bench", "parity", "--model", checkpoints["ouro"], "--device", "cpu"]
    argv += ["--dtype", "float32", "--lengths", "8,20,33", "--max-tokens", "3"]
    argv += ["--prefill-chunk", "16", "--kv-gib", "0.01"]
    assert main(argv + ["--json-out", str(out)]) == 0
    report = json.loads(out.read_text())
    for mode in ("sequential", "concurrent"):
        assert (report[mode]["match"], report[mode]["of"], report[mode]["diffs"]) == (3, 3, [])
    assert set(report["ready_s"]) == {"single", "1p1d"}


def test_bench_offline_speculation_against_plain(checkpoints, capsys):
    """--speculative-loops 0,1: the same rows with and without drafting, with the acceptance, the
    tokens a round gives and the ratio of tok/s; --speculative-max-streams caps where it runs."""
    argv = [
        "bench",
        "offline",
        "--model",
        checkpoints["nanbeige"],
        "--concurrency",
        "1",
        "--threshold",
        "1.0",
    ]
    assert (
        main(argv + ["--prompt-len", "8", "--max-tokens", "12", "--speculative-loops", "0,1"]) == 0
    )
    line = capsys.readouterr().out.splitlines()[-1]
    assert re.fullmatch(
        r"speculative_loops 1, tokens 6: conc 1 prompt 8 thr 1.0: acceptance [0-9.]+, [0-9.]+ tokens a round, "
        r"full conc tok/s x[0-9.]+ of plain",
        line,
    ), line
    # two streams where at most one may speculate: no round runs
    more = [
        "--concurrency",
        "2",
        "--threshold",
        "1.0",
        "--prompt-len",
        "8",
        "--max-tokens",
        "6",
        "--speculative-loops",
    ]
    assert main(argv[:4] + more + ["0,1", "--speculative-max-streams", "1"]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert "conc 2 prompt 8 thr 1.0: acceptance None, None tokens a round" in line, line


def test_bench_serve_takes_vllms_flags_and_prints_its_summary(checkpoints, capsys):
    """`vllm bench serve`'s random-dataset flags: --max-concurrency 4 of --num-prompts 12 (its
    request rate inf), then 6 at Poisson 50 req/s; vLLM's result block for each."""
    argv = [
        "bench",
        "serve",
        "--model",
        checkpoints["ouro"],
        "--dataset-name",
        "random",
        "--random-input-len",
        "16",
    ]
    argv += ["--random-output-len", "4", "--ignore-eos"]
    assert main(argv + ["--num-prompts", "12", "--max-concurrency", "4"]) == 0
    out = capsys.readouterr().out
    assert "============ Serving Benchmark Result ============" in out
    assert re.search(r"Successful requests: +12\n", out) and re.search(
        r"Maximum request concurrency: +4\n", out
    )
    assert re.search(r"Total input tokens: +192\nTotal generated tokens: +48\n", out)
    assert all(
        f"{s} {m} (ms):" in out for s in ("Mean", "Median", "P99") for m in ("TTFT", "TPOT", "ITL")
    )
    assert main(argv + ["--num-prompts", "6", "--request-rate", "50"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"Successful requests: +6\nRequest rate configured \(RPS\): +50.00\n", out)
