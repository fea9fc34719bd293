"""lm-evaluation-harness itself against `rlt serve` (its `local-completions` model, tasks from local
files, nothing downloaded): a multiple-choice task's per-choice loglikelihoods equal the Python
API's prompt logprobs, and a generate_until task gets the greedy continuations cut at its stop."""

import asyncio
import json
import os

import pytest

import rlt
from rlt import SamplingParams
from rlt.models.tokenizer import load_tokenizer

QUESTIONS = [
    {"question": "The river runs to the", "choices": ["sea", "hills", "sky"], "answer": 0},
    {"question": "Snow falls in", "choices": ["winter", "a kettle"], "answer": 0},
    {
        "question": "Two and two make",
        "choices": ["four", "five", "twenty-two", "fish"],
        "answer": 0,
    },
]


def _tasks(root) -> str:
    data = root / "questions.jsonl"
    data.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    common = (
        f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
    )
    (root / "mc.yaml").write_text(
        "task: rlt_mc\n" + common + "output_type: multiple_choice\ndoc_to_text: '{{question}}'\n"
        "doc_to_choice: '{{choices}}'\ndoc_to_target: '{{answer}}'\nmetric_list:\n  - metric: acc\n"
    )
    (root / "gen.yaml").write_text(
        "task: rlt_gen\n" + common + "output_type: generate_until\ndoc_to_text: '{{question}}'\n"
        "doc_to_target: '{{choices[answer]}}'\ngeneration_kwargs:\n  until: ['.']\n  max_gen_toks: 6\n"
        "  temperature: 0\nmetric_list:\n  - metric: exact_match\n"
    )
    return str(root)


async def _reference(model: str, requests: list[list[int]], generations: list[list[int]]):
    """(sum of the prompt logprobs past each context, greedy 6-token outputs) from the Python API."""
    async with rlt.Engine.launch(model) as engine:
        sums = []
        for ids, ctxlen in requests:
            sp = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0)
            out = [o async for o in engine.generate(ids, sp)][-1]
            sums.append(sum(pos[t] for pos, t in zip(out.prompt_logprobs[ctxlen:], ids[ctxlen:])))
        texts = []
        for ids in generations:
            sp = SamplingParams(max_tokens=6, temperature=0, stop=["."])
            texts.append([o async for o in engine.generate(ids, sp)][-1].text)
        return sums, texts


def test_lm_eval_harness_loglikelihoods_and_generations(checkpoints, ouro_server, tmp_path):
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    model = checkpoints["ouro"]
    with open(os.path.join(model, "config.json")) as f:
        max_length = json.load(f)["max_position_embeddings"] - 8
    results = lm_eval.simple_evaluate(
        model="local-completions",
        model_args={
            "base_url": f"{ouro_server}/completions",
            "model": "m",
            "tokenizer": model,
            "tokenizer_backend": "huggingface",
            "max_length": max_length,
            "batch_size": 4,
            "max_retries": 1,
        },
        tasks=["rlt_mc", "rlt_gen"],
        # (only these tasks: indexing lm-eval's own 14,000 takes ~8 s)
        task_manager=TaskManager(include_path=_tasks(tmp_path), include_defaults=False),
        log_samples=True,
    )
    tok = load_tokenizer(model)
    requests, got = [], []
    for sample in results["samples"]["rlt_mc"]:
        for (context, continuation), resp in zip(sample["arguments"], sample["resps"]):
            ctx = tok(context, add_special_tokens=False).input_ids
            whole = tok(context + continuation, add_special_tokens=False).input_ids
            requests.append((whole, len(ctx)))
            got.append(resp[0][0])
    gens = [
        tok(s["arguments"][0][0], add_special_tokens=False).input_ids
        for s in results["samples"]["rlt_gen"]
    ]
    sums, texts = asyncio.run(_reference(model, requests, gens))
    assert len(got) == 9 and got == pytest.approx(sums, abs=1e-4)
    assert all(g < 0 for g in got)  # (each choice scored, none a silent 0.0)
    assert [s["resps"][0][0] for s in results["samples"]["rlt_gen"]] == texts
