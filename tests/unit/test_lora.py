"""LoRA adapters in the model runner, the scheduler and the prefix cache (engine/lora/).

Random PEFT adapters on a tiny random Llama (float32) against transformers with the adapter
merged: each adapter and the base in one batch, chunked prefill, rsLoRA, a llama.cpp GGUF
adapter; the update on top of every linear method; the bad adapters refused by name; at most
``max_loras`` adapters running at once; blocks of one adapter never serving another.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from engine.core.kv_cache import KVCacheManager
from engine.lora.layer import LoRABatch, LoRAWeights
from engine.lora.request import LoRARequest
from engine.models.linear import Linear
from tests.helpers.core_utils import make_request as make_core_request
from tests.helpers.core_utils import make_scheduler, step
from tests.helpers.lora_utils import base_and_adapters, hf_greedy, make_adapter, tiny_llama, write_gguf_adapter
from tests.helpers.runner_utils import generate, make_request, make_runner

PROMPTS = [[5, 17, 300, 111, 77, 9, 12, 400, 3, 256, 31, 7, 99], [44, 45, 46], [200, 201]]
NUM_TOKENS = 10


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(dir, base HF model, {adapter name: (LoRARequest, merged HF model)})."""
    d = str(tmp_path_factory.mktemp("lora"))
    _, hf, adapters = base_and_adapters(d)
    loras = {name: (LoRARequest(name, i, path), merged) for i, (name, (path, merged)) in enumerate(adapters.items(), 1)}
    return d, hf, loras


def _runner(d: str, **kwargs):
    kwargs.setdefault("max_loras", 3)
    return make_runner(os.path.join(d, "base"), enable_lora=True, max_lora_rank=16, block_size=4, **kwargs)


def test_each_adapter_and_the_base_in_one_batch_equal_transformers_merged(models):
    d, hf, loras = models
    runner = _runner(d)
    reqs, refs = [], []
    for k, (name, (lora, merged)) in enumerate([(None, (None, hf)), *loras.items()]):
        for i, prompt in enumerate(PROMPTS):
            req = make_request(f"{name}-{i}", prompt)
            req.lora_request = lora
            reqs.append(req)
            refs.append(hf_greedy(merged, prompt, NUM_TOKENS))
    generate(runner, reqs, NUM_TOKENS, chunk=5)  # chunked prefill beside decodes of other adapters
    assert [r.output_token_ids for r in reqs] == refs
    assert len({tuple(r) for r in refs[:: len(PROMPTS)]}) == 4  # every adapter changed the output


def test_slots_are_reused_when_more_adapters_than_slots_run_over_time(models):
    d, hf, loras = models
    runner = _runner(d, max_loras=1)
    for name, (lora, merged) in [*loras.items(), *loras.items()]:  # each adapter evicts the one before
        req = make_request(name, PROMPTS[0])
        req.lora_request = lora
        generate(runner, [req], NUM_TOKENS)
        assert req.output_token_ids == hf_greedy(merged, PROMPTS[0], NUM_TOKENS), name


def test_gguf_adapter_gives_the_peft_adapters_tokens(models, tmp_path):
    d, hf, loras = models
    path = str(tmp_path / "all.gguf")
    write_gguf_adapter(os.path.join(d, "all"), path, hf.config, alpha=16)
    runner = _runner(d)
    req = make_request("gguf", PROMPTS[0])
    req.lora_request = LoRARequest("all-gguf", 9, path)
    generate(runner, [req], NUM_TOKENS)
    assert req.output_token_ids == hf_greedy(loras["all"][1], PROMPTS[0], NUM_TOKENS)


@pytest.mark.parametrize("method", ["fp32", "int8", "gguf-q8_0"])
def test_update_is_added_on_top_of_every_linear_method(method):
    from engine.models.linear import GGUFBlocks, GGUFLinear, InputMajorLinear, Int8Method

    torch.manual_seed(0)
    weight = torch.randn(96, 64)
    if method == "fp32":
        base = InputMajorLinear(weight, torch.float32)
    elif method == "int8":
        base = Int8Method(weight)
    else:
        import gguf

        blocks = gguf.quants.quantize(weight.numpy(), gguf.GGMLQuantizationType.Q8_0)
        base = GGUFLinear(GGUFBlocks(torch.from_numpy(blocks), int(gguf.GGMLQuantizationType.Q8_0), 96, 64))
    batch = LoRABatch()
    lora = LoRAWeights([32, 64], 64, slots=2, max_rank=8, dtype=torch.float32, device=torch.device("cpu"), batch=batch)
    a0, b0, a1, b1 = torch.randn(4, 64), torch.randn(32, 4), torch.randn(4, 64), torch.randn(64, 4)
    lora.set_slot(1, 4, [(a0, b0), (a1, b1)])
    linear = Linear(base)
    linear.lora = lora
    x = torch.randn(6, 64)
    rows = torch.tensor([1, 4])
    batch.set([(1, rows.tolist())])
    expected = base.apply(x)
    expected[rows] += torch.cat([x[rows] @ a0.T @ b0.T, x[rows] @ a1.T @ b1.T], dim=1)
    torch.testing.assert_close(linear(x), expected)


@pytest.mark.parametrize(
    "dtype, slots",
    [(torch.float32, (0, 2, 3)), (torch.bfloat16, (0, 2, 3)), (torch.bfloat16, (1,))],
    ids=["kernel", "torch", "torch-one-slot-every-row"],
)
def test_several_slots_in_one_step_each_update_only_their_rows(dtype, slots):
    """float32 runs the SGMV kernel, bf16 torch's products per slot: uneven row counts, a slot
    whose adapter has a lower rank than another's and skips one part, and rows with no adapter
    (or one slot with every row, which torch runs without a gather)."""
    torch.manual_seed(1)
    batch = LoRABatch()
    lora = LoRAWeights([32, 16], 64, slots=4, max_rank=8, dtype=dtype, device=torch.device("cpu"), batch=batch)
    pairs = {}
    for i, slot in enumerate(slots):
        rank = 8 if i == 0 else 4
        part = [(torch.randn(rank, 64), torch.randn(32, rank)), (torch.randn(rank, 64), torch.randn(16, rank))]
        if i == 1:
            part[1] = None  # this adapter leaves the second part alone
        lora.set_slot(slot, rank, part)
        pairs[slot] = part
    x, y = torch.randn(9, 64), torch.randn(9, 48)
    rows = {slots[0]: [0, 3, 4, 8], slots[1]: [6], slots[2]: [1, 2]} if len(slots) > 1 else {slots[0]: list(range(9))}
    batch.set(list(rows.items()))
    expected = y.clone()
    for slot, rs in rows.items():
        for r in rs:
            for (a, b), cols in zip(
                [p or (torch.zeros(1, 64), torch.zeros(16, 1)) for p in pairs[slot]], (slice(0, 32), slice(32, 48))
            ):
                expected[r, cols] += x[r] @ a.T.to(dtype).float() @ b.T.to(dtype).float()
    got = lora.add_(x.to(dtype), y.to(dtype)).float()
    tol = dict(rtol=1e-5, atol=1e-4) if dtype == torch.float32 else dict(rtol=0.05, atol=0.5)
    torch.testing.assert_close(got, expected, **tol)


def _write_config(path: str, **changes) -> None:
    file = os.path.join(path, "adapter_config.json")
    with open(file) as f:
        cfg = json.load(f)
    cfg.update(changes)
    with open(file, "w") as f:
        json.dump(cfg, f)


@pytest.fixture(scope="module")
def manager(models):
    return _runner(models[0]).lora


@pytest.mark.parametrize(
    "change, message",
    [
        ({"use_dora": True}, "use_dora"),
        ({"bias": "lora_only"}, "bias"),
        ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
        ({"target_modules": ["q_proj", "embed_tokens"]}, "embed_tokens"),
        ({"rank_pattern": {"q_proj": 4}}, "rank_pattern"),
    ],
)
def test_unsupported_adapter_config_is_refused_by_name(models, manager, tmp_path, change, message):
    import shutil

    path = str(tmp_path / "bad")
    shutil.copytree(os.path.join(models[0], "all"), path)
    _write_config(path, **change)
    with pytest.raises(ValueError, match=message):
        manager.add_lora(LoRARequest("bad", 50, path))


def test_bad_adapters_are_refused_by_name(models, manager, tmp_path):
    d, hf, _ = models
    with pytest.raises(ValueError, match="'missing'.*neither a directory"):
        manager.add_lora(LoRARequest("missing", 51, str(tmp_path / "nowhere")))
    os.makedirs(tmp_path / "empty")
    with pytest.raises(ValueError, match="adapter_config.json not found"):
        manager.add_lora(LoRARequest("empty", 52, str(tmp_path / "empty")))
    make_adapter(hf, str(tmp_path / "r32"), seed=4, r=32)
    with pytest.raises(ValueError, match="rank 32 is above max_lora_rank 16"):
        manager.add_lora(LoRARequest("r32", 53, str(tmp_path / "r32")))
    other = tiny_llama(str(tmp_path / "wider"), hidden_size=96)  # another base: the shapes do not fit
    make_adapter(other, str(tmp_path / "wide"), seed=5)
    with pytest.raises(ValueError, match="'wide'.*the base model's"):
        manager.add_lora(LoRARequest("wide", 54, str(tmp_path / "wide")))
    make_adapter(hf, str(tmp_path / "head"), seed=6, targets=["lm_head"])
    with pytest.raises(ValueError, match="lm_head"):
        manager.add_lora(LoRARequest("head", 55, str(tmp_path / "head")))
    assert manager.list_loras() == []  # nothing half-loaded


def test_at_most_max_loras_adapters_run_at_once_the_others_wait():
    scheduler = make_scheduler()
    scheduler.max_loras = 2
    loras = [LoRARequest(f"a{i}", i, f"/adapters/a{i}") for i in (1, 2, 3)]
    reqs = []
    for i, lora in enumerate([loras[0], loras[1], loras[2], None, loras[0]]):
        req = make_core_request(str(i), [10 + i] * 8, max_tokens=3)
        req.lora_request = lora
        scheduler.add_request(req)
        reqs.append(req)
    ran: list[set] = []
    while scheduler.has_unfinished_requests():
        sched, _ = step(scheduler)
        ran.append({r.request_id for r in sched.requests})
        running = {r.lora_request.lora_int_id for r in scheduler.running if r.lora_request is not None}
        assert len(running) <= 2
    assert ran[0] == {"0", "1", "3", "4"}  # a3 waits; the base and a1's second request pass it
    assert "2" in set().union(*ran[1:])  # and it runs once a slot frees


def test_prefix_cache_blocks_of_one_adapter_never_serve_another_or_the_base():
    kv = KVCacheManager(64, 4, enable_caching=True)
    prompt = list(range(100, 116))
    loras = [None, LoRARequest("a", 1, "/a"), LoRARequest("b", 2, "/b"), LoRARequest("a", 1, "/other-a")]
    digests = []
    for i, lora in enumerate(loras):
        req = make_core_request(str(i), prompt)
        req.lora_request = lora
        digests.append(tuple(kv.block_hashes(req, len(prompt))))
    assert len(set(digests)) == len(loras)
    again = make_core_request("again", prompt)
    again.lora_request = LoRARequest("a", 1, "/a")
    assert tuple(kv.block_hashes(again, len(prompt))) == digests[1]


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(max_loras=0), "max_loras must be an int >= 1"),
        (dict(max_lora_rank=12), r"max_lora_rank \(12\) must be one of"),
        (dict(max_loras=4, max_cpu_loras=2), r"max_cpu_loras \(2\) must be an int >= max_loras \(4\)"),
        (dict(compilation_config=1), "enable_lora: the compiled graphs"),
    ],
)
def test_lora_limits_are_checked_by_name(tiny_model_dir, fields, message):
    from engine.config import EngineArgs

    with pytest.raises(ValueError, match=message):
        EngineArgs(model=tiny_model_dir, load_format="dummy", enable_lora=True, **fields).create_engine_config()
