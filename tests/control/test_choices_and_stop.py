"""The Python API's n and stop strings (rlt.SamplingParams): a call's choices are tagged by index and
each equals a separate call with seed + i; a stop string ends a choice at the token that completed
it (token ids, logprobs and text end there) and aborts the rest; text only grows; special tokens
are kept when asked."""

import msgspec
import pytest

import rlt
from rlt import SamplingParams
from rlt.errors import RequestError

replace = msgspec.structs.replace


async def run(engine, prompt, sp, **kw) -> dict[int, list]:
    outs: dict[int, list] = {}
    async for o in engine.generate(prompt, sp, **kw):
        outs.setdefault(o.index, []).append(o)
    return outs


def close(a: list, b: list) -> bool:
    """Two runs' logprobs: the same positions and ids, values within 1e-4."""
    return len(a) == len(b) and all(
        x == y
        or (
            x is not None
            and y is not None
            and x.keys() == y.keys()
            and max(abs(x[k] - y[k]) for k in x) < 1e-4
        )
        for x, y in zip(a, b)
    )


async def test_n_choices_stop_strings_and_growing_text():
    async with rlt.Engine.launch(max_num_seqs=8) as engine:
        tok = engine.tokenizer
        sp = SamplingParams(max_tokens=24, temperature=1.0, seed=40, ignore_eos=True, logprobs=2)
        three = await run(engine, "Hello", replace(sp, n=3), request_id="call")
        assert sorted(three) == [0, 1, 2] and all(outs[-1].finished for outs in three.values())
        for i, outs in three.items():
            alone = (await run(engine, "Hello", replace(sp, seed=40 + i)))[0][-1]
            assert (outs[-1].token_ids, outs[-1].text, outs[-1].index) == (
                alone.token_ids,
                alone.text,
                i,
            )
            texts = [o.text for o in outs]  # only grows, and ends as the whole decode
            assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))
            assert texts[-1] == tok.decode(outs[-1].token_ids, skip_special_tokens=True)
        # a stop string: the text before it, the token ids (and logprobs) up to the one completing
        # it
        full = three[0][-1]
        stop = next(
            full.text[i : i + 2]
            for i in range(6, len(full.text) - 2)
            if "\ufffd" not in full.text[i : i + 2]
        )
        start = full.text.find(stop)
        cut = (await run(engine, "Hello", replace(sp, stop=[stop, "never there"])))[0][-1]
        ids = cut.token_ids
        assert (cut.text, cut.finish_reason, cut.stop_reason) == (full.text[:start], "stop", stop)
        assert ids == full.token_ids[: len(ids)] and len(cut.logprobs) == len(ids) == len(
            cut.exit_depths
        )
        assert stop in tok.decode(ids) and stop not in tok.decode(ids[:-1])
        kept = (
            await run(engine, "Hello", replace(sp, stop=[stop], include_stop_str_in_output=True))
        )[0][-1]
        assert kept.text == full.text[: start + len(stop)] and kept.token_ids == ids
        # min_tokens: a stop string completed before min_tokens outputs does not count
        late = (await run(engine, "Hello", replace(sp, stop=[stop], min_tokens=len(ids) + 1)))[0][
            -1
        ]
        assert len(late.token_ids) > len(ids) and late.token_ids[: len(ids)] == ids
        # a stop token id: finish "stop", stop_reason the id
        tid = full.token_ids[5]
        by_id = (await run(engine, "Hello", replace(sp, stop_token_ids=[tid])))[0][-1]
        assert (by_id.token_ids[-1], by_id.finish_reason, by_id.stop_reason) == (tid, "stop", tid)
        # every slot came back: the stopped choices were aborted in the workers
        assert engine.stats().live_requests == 0
        # special tokens in the text when asked
        eos = engine.model_config.eos_token_ids[0]
        special = SamplingParams(
            max_tokens=3, temperature=0, stop_token_ids=[], logit_bias={eos: 100}, ignore_eos=True
        )
        with_special = (await run(engine, "Hello", replace(special, skip_special_tokens=False)))[0][
            -1
        ]
        assert with_special.text == tok.decode([eos] * 3, skip_special_tokens=False) != ""
        # output kinds: the deltas add up to the cumulative outputs; final_only gives the last alone
        kinds = replace(sp, n=2, stop=[stop], prompt_logprobs=1)
        whole = await run(engine, "Hello", kinds)
        deltas = await run(engine, "Hello", kinds, output_kind="delta")
        final = await run(engine, "Hello", kinds, output_kind="final_only")
        for i, outs in whole.items():
            last, ds, (only,) = outs[-1], deltas[i], final[i]
            joined = [
                sum((getattr(d, f) for d in ds), [])
                for f in ("token_ids", "exit_depths", "logprobs")
            ]
            assert joined[:2] == [last.token_ids, last.exit_depths] and len(last.token_ids) > 1
            # (logprobs: the same ids; the values of another run, whose passes may batch rows
            # differently)
            assert close(joined[2], last.logprobs) and close(
                ds[0].prompt_logprobs, last.prompt_logprobs
            )
            assert "".join(d.text for d in ds) == last.text
            assert last.prompt_logprobs is not None and all(
                d.prompt_logprobs is None for d in ds[1:]
            )
            assert [d.finished for d in ds] == [False] * (len(ds) - 1) + [True]
            assert (ds[-1].finish_reason, ds[-1].stop_reason) == (
                last.finish_reason,
                last.stop_reason,
            )
            assert (only.token_ids, only.text, only.stop_reason, only.finished) == (
                last.token_ids,
                last.text,
                last.stop_reason,
                True,
            )
        assert whole[0][-1].stop_reason == stop
        with pytest.raises(
            RequestError, match="output_kind must be one of cumulative, delta, final_only"
        ):
            engine.generate("Hello", sp, output_kind="deltas")
        # abort by the call's id ends every choice
        stream = engine.generate("Hello", replace(sp, n=2, max_tokens=200), request_id="long")
        first = await anext(stream)
        assert await engine.abort("long") and not await engine.abort("long")
        rest = [o async for o in stream]
        assert first.index in (0, 1) and all(o.finish_reason == "abort" for o in rest if o.finished)
        with pytest.raises(RequestError, match="n must be <= 128"):
            engine.generate("Hello", replace(sp, n=129))
        with pytest.raises(RequestError, match="stop has 17 strings"):
            engine.generate("Hello", replace(sp, stop=["a"] * 17))
        with pytest.raises(RequestError, match="seed must be <="):
            engine.generate("Hello", replace(sp, n=2, seed=2**63 - 1))
