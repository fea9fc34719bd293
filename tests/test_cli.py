"""`rlt generate` and `rlt make-checkpoint` as a user runs them (real subprocesses)."""

import json
import os
import re
import subprocess
import sys

import pytest

from tests.processes import as_from_a_terminal, rlt_processes_of, wait_for_ready_workers
from tests.reference import Ref, ref_generate

PROMPTS = [[11, 42, 7, 300, 19, 5], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]]


def rlt(*args, env=None):
    r = subprocess.run(
        [sys.executable, "-m", "rlt", *map(str, args)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=300,
    )
    return r


def generate_json(*args):
    r = rlt("generate", *args, "--json")
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


# One run per family, through --hf-overrides where it has one to take (each family's depths and
# overrides against the references, in-process: test_engine's CASES, test_models; Ouro at its full
# depth through the CLI: test_adaptive_exit_through_cli).
CASES = [
    ("ouro", {"total_ut_steps": 2}),
    ("nanbeige", {}),
    ("huginn", {"state_init": "zero", "mean_recurrence": 8}),
]


@pytest.mark.parametrize("family,overrides", CASES)
def test_greedy_continuations_match_reference(checkpoints, family, overrides):
    args = [
        "--model",
        checkpoints[family],
        "--max-tokens",
        6,
        "--ignore-eos",
        "--logprobs",
        5,
        "--dtype",
        "float32",
    ]
    for p in PROMPTS:
        args += ["--prompt-token-ids", ",".join(map(str, p))]
    if overrides:
        args += ["--hf-overrides", json.dumps(overrides)]
    outs = generate_json(*args)
    ref = Ref(checkpoints[family], overrides)
    assert [o["request_id"] for o in outs] == ["0", "1"]
    for o, prompt in zip(outs, PROMPTS):
        tokens, depths, logps = ref_generate(ref, prompt, 6)
        assert o["prompt_token_ids"] == prompt
        assert o["token_ids"] == tokens and o["exit_depths"] == depths
        assert o["finish_reason"] == "length"
        assert len(o["logprobs"]) == 6
        for pos, lp in zip(o["logprobs"], logps):
            assert len(pos) == 5
            assert list(map(int, pos)) == lp.topk(5).indices.tolist()
            for t, v in pos.items():
                assert abs(v - lp[int(t)].item()) < 1e-4


def test_text_prompts_and_order(checkpoints):
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(checkpoints["huginn"])
    outs = generate_json(
        "--model",
        checkpoints["huginn"],
        "--prompt",
        "The river runs",
        "--prompt-token-ids",
        "5,6,7",
        "--prompt",
        "Once upon a time",
        "--max-tokens",
        3,
        "--ignore-eos",
        "--hf-overrides",
        '{"mean_recurrence": 4}',
    )
    assert [o["request_id"] for o in outs] == ["0", "1", "2"]
    assert outs[0]["prompt_token_ids"] == tok("The river runs").input_ids
    assert outs[0]["prompt_token_ids"][0] == tok.bos_token_id  # Huginn's tokenizer prepends BOS
    assert outs[1]["prompt_token_ids"] == [5, 6, 7]
    assert outs[2]["text"] == tok.decode(outs[2]["token_ids"], skip_special_tokens=True)


def test_stops_on_eos_and_stop_token_ids(checkpoints):
    base = ["--model", checkpoints["ouro"], "--prompt-token-ids", "11,42,7", "--max-tokens", 8]
    # (the CLI's greedy tokens: as above)
    first = ref_generate(Ref(checkpoints["ouro"]), [11, 42, 7], 8)[0]
    second = first[1]
    out = generate_json(*base, "--stop-token-ids", f"{second},500")[0]
    assert out["token_ids"] == first[:2] and out["finish_reason"] == "stop"
    out = generate_json(*base, "--hf-overrides", json.dumps({"eos_token_id": first[0]}))[0]
    assert out["token_ids"] == first[:1] and out["finish_reason"] == "stop"
    out = generate_json(
        *base, "--hf-overrides", json.dumps({"eos_token_id": first[0]}), "--ignore-eos"
    )[0]
    assert out["token_ids"] == first and out["finish_reason"] == "length"


def test_seeded_sampling_is_reproducible(checkpoints):
    args = [
        "--model",
        checkpoints["nanbeige"],
        "--prompt-token-ids",
        "11,42,7",
        "--max-tokens",
        12,
        "--temperature",
        1.0,
        "--top-k",
        50,
        "--top-p",
        0.9,
        "--ignore-eos",
    ]
    a = generate_json(*args, "--seed", 1)[0]["token_ids"]
    assert a == generate_json(*args, "--seed", 1)[0]["token_ids"]
    assert a != generate_json(*args, "--seed", 2)[0]["token_ids"]


def test_adaptive_exit_through_cli(checkpoints):
    out = generate_json(
        "--model",
        checkpoints["ouro"],
        "--prompt-token-ids",
        "11,42,7,300",
        "--max-tokens",
        16,
        "--exit-threshold",
        0.5,
        "--min-loops",
        1,
        "--max-loops",
        4,
        "--ignore-eos",
    )[0]
    tokens, depths, _ = ref_generate(Ref(checkpoints["ouro"]), [11, 42, 7, 300], 16, 1, 4, 0.5)
    assert out["token_ids"] == tokens and out["exit_depths"] == depths
    assert depths[0] == 4 and len(set(depths)) >= 3


@pytest.mark.parametrize(
    "args,message",
    [
        (["--max-tokens", 0], "max_tokens must be >= 1"),
        (
            ["--prompt-token-ids", "1,512"],
            "token id 512 at index 1 is outside the vocabulary [0, 512)",
        ),
        (["--min-loops", 3, "--max-loops", 2], "min_loops must be <= max_loops (2)"),
        (["--max-loops", 5], "max_loops must be <= the model's depth 4"),
        (["--top-p", 0], "top_p must be in (0, 1]"),
        (["--temperature", -1], "temperature must be >= 0"),
        (["--exit-threshold", 1.5], "exit_threshold must be in [0, 1]"),
        (["--max-tokens", 70000], "exceeds the model's max positions 65536"),
        (["--hf-overrides", '{"rope_scaling": {"type": "linear", "factor": 2}}'], "'rope_scaling'"),
        (["--dtype", "float32", "--hf-overrides", '{"total_ut_steps": 0}'], "'total_ut_steps'"),
        (["--heartbeat-timeout", 0], "heartbeat_timeout must be a number > 0, got 0.0"),
        (["--heartbeat-interval", 20], "heartbeat_interval 20.0 must be < heartbeat_timeout 10.0"),
        (["--kv-memory-bytes", 100], "kv_memory_bytes 100 holds no KV block"),
    ],
)
def test_bad_input_is_a_clear_error(checkpoints, args, message):
    """One line on stderr, exit 2, no worker started."""
    r = rlt(
        "generate", "--model", checkpoints["ouro"], "--prompt-token-ids", "1,2,3", *args, "--json"
    )
    assert r.returncode == 2
    assert message in r.stderr and r.stdout == "" and len(r.stderr.splitlines()) == 1


def test_long_prompt_shows_its_prefill_on_stderr(checkpoints):
    ids = ",".join(str((i * 7) % 400 + 3) for i in range(3000))
    r = rlt(
        "generate",
        "--model",
        checkpoints["ouro"],
        "--prompt-token-ids",
        ids,
        "--max-tokens",
        2,
        "--json",
    )
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert lines[0] == "rlt: prompt 0: prefilling 3,000 tokens"
    assert re.fullmatch(r"rlt: prompt 0: first token after \d+\.\d s", lines[1]), lines
    assert len(json.loads(r.stdout)["token_ids"]) == 2


def test_no_tokenizer_needs_token_ids(checkpoints, tmp_path):
    import shutil

    d = tmp_path / "notok"
    shutil.copytree(checkpoints["ouro"], d)
    os.remove(d / "tokenizer.json")
    r = rlt("generate", "--model", d, "--prompt", "hello")
    assert r.returncode == 2 and "no tokenizer.json" in r.stderr
    out = generate_json("--model", d, "--prompt-token-ids", "1,2", "--max-tokens", 2)[0]
    assert out["text"] == "" and len(out["token_ids"]) == 2


def test_default_model_is_made_on_first_use(tmp_path):
    env = {"RLT_CACHE_DIR": str(tmp_path)}
    r = rlt("generate", "--prompt", "Hello world", "--max-tokens", 4, "--json", env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert len(out["token_ids"]) <= 4 and out["exit_depths"][0] == 4
    assert os.path.isfile(tmp_path / "ouro-tiny-v1" / "model.safetensors")
    r2 = rlt("generate", "--prompt", "Hello world", "--max-tokens", 4, "--json", env=env)
    assert json.loads(r2.stdout) == out  # deterministic default: greedy, same checkpoint
    human = rlt("generate", "--prompt", "Hello world", "--max-tokens", 4, env=env)
    assert human.returncode == 0 and "exit depths" in human.stdout


@pytest.mark.parametrize("family", ["ouro", "nanbeige", "huginn"])
def test_cpu_generation_needs_no_triton(checkpoints, family, tmp_path):
    """The README's first command installs no triton (a test extra): the CPU path never imports it."""
    (tmp_path / "triton").mkdir()
    (tmp_path / "triton" / "__init__.py").write_text(
        "raise ImportError('triton is not installed')\n"
    )
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    args = [
        "--model",
        checkpoints[family],
        "--prompt-token-ids",
        "5,6,7,8",
        "--max-tokens",
        4,
        "--ignore-eos",
        "--json",
    ]
    if family == "huginn":
        args += ["--hf-overrides", '{"mean_recurrence": 4}']
    r = rlt("generate", *args, env={"PYTHONPATH": path})
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["token_ids"]) == 4


def test_make_checkpoint_cli(tmp_path):
    r = rlt(
        "make-checkpoint", "--family", "huginn", "--out", tmp_path / "h", "--seed", 3, "--shards", 2
    )
    assert r.returncode == 0, r.stderr
    names = sorted(os.listdir(tmp_path / "h"))
    assert (
        "model.safetensors.index.json" in names
        and "tokenizer.json" in names
        and "config.json" in names
    )
    cfg = json.loads((tmp_path / "h" / "config.json").read_text())
    assert (
        cfg["model_type"] == "huginn_raven"
        and cfg["mean_recurrence"] == 32
        and cfg["n_layers"] == 8
    )
    tcfg = json.loads((tmp_path / "h" / "tokenizer_config.json").read_text())
    assert "chat_template" in tcfg and tcfg["eos_token"] == "<|end_text|>"
    out = generate_json(
        "--model",
        tmp_path / "h",
        "--prompt",
        "Hi",
        "--max-tokens",
        2,
        "--hf-overrides",
        '{"mean_recurrence": 2}',
    )
    assert len(out) == 1


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_ctrl_c_exits_with_one_line_and_leaves_nothing(checkpoints, tmp_path, sig):
    """SIGINT (or SIGTERM, SIGHUP: handled alike) to `rlt generate` mid-generation: exit 130 with one
    line on stderr, no worker process and no temporary directory left (workers run in their own
    process group: only the coordinator takes a terminal's Ctrl-C)."""
    import signal
    import time

    env = {**os.environ, "TMPDIR": str(tmp_path)}
    with as_from_a_terminal(
        [
            sys.executable,
            "-m",
            "rlt",
            "generate",
            "--model",
            checkpoints["ouro"],
            "--prompt-token-ids",
            "5,6,7",
            "--max-tokens",
            "60000",
            "--ignore-eos",
        ],
        env,
    ) as p:
        [worker] = wait_for_ready_workers(p.pid, 1, timeout=60)
        time.sleep(0.5)  # (generating)
        worker_pgid = os.getpgid(worker)
        assert worker_pgid != os.getpgid(p.pid)
        p.send_signal(getattr(signal, sig))
        out, err = p.communicate(timeout=60)
        assert p.returncode == 130 and err.strip() == "rlt: interrupted", err
        assert not any(tmp_path.glob("rlt-*"))
        assert not rlt_processes_of(p.pid)


def test_every_flag_has_help_naming_its_default_and_there_is_a_version():
    """Each flag of each command says what it does and, where it has a default, what it is."""
    import argparse
    from importlib.metadata import version

    from rlt.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for name, command in sub.choices.items():
        for a in command._actions:
            if isinstance(a, argparse._HelpAction) or not a.option_strings:
                continue
            assert a.help, (name, a.option_strings)
            if a.default not in (None, False, [], {}, argparse.SUPPRESS):
                assert "default" in a.help or a.choices is not None and str(a.default) in a.help, (
                    name,
                    a.dest,
                    a.help,
                )
    out = subprocess.run(
        [sys.executable, "-m", "rlt", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == f"rlt {version('rlt')}"


def _hub_cache(root, checkpoint: str, repo: str) -> str:
    """A Hugging Face cache as huggingface_hub lays it out: refs/main names a snapshot's commit."""
    import shutil

    commit = "0123456789abcdef0123456789abcdef01234567"
    base = os.path.join(root, "models--" + repo.replace("/", "--"))
    shutil.copytree(checkpoint, os.path.join(base, "snapshots", commit))
    os.makedirs(os.path.join(base, "refs"))
    with open(os.path.join(base, "refs", "main"), "w") as f:
        f.write(commit)
    return str(root)


def test_a_hub_id_resolves_offline_from_the_cache(checkpoints, tmp_path):
    """`rlt generate --model ORG/NAME` and `rlt serve ORG/NAME` find the snapshot in the hub cache
    (HF_HUB_OFFLINE=1: no network), with the same tokens as the directory; an id that is not cached
    says how to download it."""
    import json
    import signal
    import urllib.request

    from tests.helpers import FAST_ARGS
    from tests.serve.helpers import free_port

    env = {
        **os.environ,
        "HF_HUB_CACHE": _hub_cache(tmp_path / "hub", checkpoints["ouro"], "acme/ouro-tiny"),
    }
    env["HF_HUB_OFFLINE"] = "1"
    argv = ["--prompt-token-ids", "5,6,7", "--max-tokens", "4", "--json"]
    outs = [
        subprocess.run(
            [sys.executable, "-m", "rlt", "generate", "--model", m, *argv],
            env=env,
            capture_output=True,
        )
        for m in ("acme/ouro-tiny", checkpoints["ouro"])
    ]
    assert outs[0].returncode == 0 and outs[0].stdout == outs[1].stdout, outs[0].stderr
    missing = subprocess.run(
        [sys.executable, "-m", "rlt", "generate", "--model", "acme/missing", *argv],
        env=env,
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 2 and "hf download acme/missing" in missing.stderr, missing.stderr
    port = free_port()
    serve = [
        sys.executable,
        "-m",
        "rlt",
        "serve",
        "acme/ouro-tiny",
        "--port",
        str(port),
        *FAST_ARGS,
    ]
    p = subprocess.Popen(
        serve, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert "acme/ouro-tiny ready at" in p.stdout.readline()
        body = json.dumps(
            {"model": "acme/ouro-tiny", "prompt": [5, 6, 7], "max_tokens": 4, "temperature": 0}
        )
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions",
            body.encode(),
            {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            assert json.loads(r.read())["usage"]["completion_tokens"] == 4
    finally:
        p.send_signal(signal.SIGINT)
        p.wait(30)
