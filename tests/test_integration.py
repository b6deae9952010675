"""PyTorch integration: the custom operators pass opcheck and compile without graph breaks; the transformers backend
matches SDPA on a tiny Llama built from a config (logits, greedy generation, left and right padding in prefill, generation
and training) and refuses what it cannot do."""
import copy
import re
import subprocess
import sys

import pytest
import torch

import triton_fa2
from triton_fa2.ops import _attention_op, _decode_op
from test_attention import DEVICE, randn

transformers = pytest.importorskip("transformers", reason="the hf extra: pip install 'triton_fa2[hf]'")
import triton_fa2.hf as hf  # noqa: E402

# Tests marked newest_triton_only reach the kernels through PyTorch's or transformers' machinery (opcheck, torch.compile,
# models): .ci/run runs them on the newest Triton only; on Triton 3.6 the kernel tests run the same kernels through the
# same entry points, and test_opcheck and test_tiny_llama_matches_sdpa_and_generates_the_same_tokens run there too.


@pytest.mark.parametrize("op, args", [
    (_attention_op, lambda: (randn(2, 4, 20, 32), randn(2, 2, 30, 32), randn(2, 2, 30, 32), True, 0.2, False)),        # SDPA layout, GQA
    (_attention_op, lambda: (randn(1, 20, 2, 64).transpose(1, 2), randn(1, 9, 2, 64).transpose(1, 2),
                             randn(1, 9, 2, 64).transpose(1, 2), False, 0.125, True)),                                 # flash layout, strided
    (_decode_op, lambda: (randn(2, 4, 3, 32), randn(2, 2, 30, 32), randn(2, 2, 30, 32),
                          torch.tensor([4, 30], dtype=torch.int32, device=DEVICE), True, 0.2, 3)),                     # split, ragged
    (_decode_op, lambda: (randn(1, 2, 1, 32, dtype=torch.bfloat16), randn(1, 2, 17, 32, dtype=torch.bfloat16),
                          randn(1, 2, 17, 32, dtype=torch.bfloat16), None, False, 0.2, 1)),                             # bf16, unsplit
])
def test_opcheck(op, args):
    result = torch.library.opcheck(op, args())
    assert set(result.values()) == {"SUCCESS"}, result


def test_public_functions_go_through_the_operators():
    "attention, flash_attn_func and decode all dispatch triton_fa2's operators (seen by the profiler)."
    q, k, v = randn(1, 2, 5, 32), randn(1, 2, 5, 32), randn(1, 2, 5, 32)
    with torch.profiler.profile() as prof:
        triton_fa2.attention(q, k, v); triton_fa2.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        triton_fa2.decode(q[:, :, :1], k, v)
    names = [e.name for e in prof.events()]
    assert names.count("triton_fa2::attention") >= 2 and names.count("triton_fa2::decode") >= 1, set(names)


@pytest.mark.newest_triton_only
def test_compile_fullgraph_without_breaks():
    def block(q, k, v):
        return triton_fa2.attention(q, k, v, causal=True) * 2 + triton_fa2.decode(q[:, :, -1:], k, v)
    q, k, v = randn(2, 4, 20, 32), randn(2, 2, 30, 32), randn(2, 2, 30, 32)
    explanation = torch._dynamo.explain(block)(q, k, v)
    assert explanation.graph_count == 1 and explanation.graph_break_count == 0, explanation.break_reasons
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager" if DEVICE.type == "cpu" else "inductor")
    assert torch.equal(compiled(q, k, v), block(q, k, v))


def tiny_llama(dtype=torch.float16):
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to(device=DEVICE, dtype=dtype).eval()


def test_tiny_llama_matches_sdpa_and_generates_the_same_tokens(monkeypatch):
    hf.register()
    calls = []
    real = hf.attention_forward
    monkeypatch.setitem(transformers.AttentionInterface._global_mapping, "triton_fa2", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    model = tiny_llama()
    ids = torch.randint(0, 256, (2, 24), device=DEVICE)
    with torch.no_grad():
        model.set_attn_implementation("sdpa"); ref = model(ids).logits.float()
        gen_ref = model.generate(ids[:1, :8], max_new_tokens=16, do_sample=False)
        model.set_attn_implementation("triton_fa2"); ours = model(ids).logits.float()
        gen = model.generate(ids[:1, :8], max_new_tokens=16, do_sample=False)
    assert calls, "the model did not call triton_fa2's attention"
    assert (ours - ref).abs().max().item() < 2e-2
    assert torch.equal(gen, gen_ref)


@pytest.mark.newest_triton_only
def test_padding_and_refusals():
    hf.register()
    model = tiny_llama()
    model.set_attn_implementation("triton_fa2")
    ids = torch.randint(0, 256, (2, 24), device=DEVICE)
    with torch.no_grad():
        mask = torch.ones(2, 24, dtype=torch.long, device=DEVICE); mask[1, 15:] = 0
        padded = model(ids, attention_mask=mask).logits.float()
        alone = model(ids[1:, :15]).logits.float()
        assert (padded[1, :15] - alone[0]).abs().max().item() < 2e-2       # right padding: real tokens exact
        left = torch.ones_like(mask); left[1, :9] = 0
        assert (model(ids, attention_mask=left).logits[1, 9:].float() - model(ids[1:, 9:]).logits[0].float()).abs().max() < 2e-2
    attn = model.model.layers[0].self_attn
    q, k = randn(1, 4, 5, 32), randn(1, 2, 5, 32)
    with pytest.raises(ValueError, match="arbitrary masks are not supported"): hf.attention_forward(attn, q, k, k, torch.zeros(1, 1, 5, 5))
    with pytest.raises(ValueError, match="does not implement attention dropout"): hf.attention_forward(attn, q, k, k, None, dropout=0.1)
    with pytest.raises(ValueError, match="softcap must be a finite number"): hf.attention_forward(attn, q, k, k, None, softcap=-1.0)
    # one new token against a cache with padding inside (right-padded prompt, then generated tokens): only real keys are read
    out, _ = hf.attention_forward(attn, q[:, :, :1], k, k, torch.tensor([[1, 1, 0, 0, 1]], device=DEVICE))
    real = k[:, :, [0, 1, 4]]
    assert (out.float() - triton_fa2.attention(q[:, :, :1], real, real, causal=True).transpose(1, 2).float()).abs().max() < 2e-3
    # non-causal (encoder-style) with right padding: padded keys are never read
    out, weights = hf.attention_forward(attn, q, k, k, torch.tensor([[1, 1, 1, 0, 0]], device=DEVICE), is_causal=False)
    ref = triton_fa2.attention(q[:, :, :3], k[:, :, :3], k[:, :, :3]).transpose(1, 2)
    assert weights is None and out.shape == (1, 5, 4, 32) and (out[:, :3].float() - ref.float()).abs().max().item() < 2e-3
    assert (out[:, 3:] == 0).all()                                          # padded queries: zeros, as flash-attn's path gives


@pytest.mark.newest_triton_only
def test_float32_model_is_told_how_to_load():
    "transformers builds a model from a config in float32: the error says to load it in bf16 or fp16, not which q/k/v dtypes."
    hf.register()
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                                      num_key_value_heads=2, attn_implementation="triton_fa2")
    model = transformers.LlamaForCausalLM(config).to(DEVICE).eval()
    assert next(model.parameters()).dtype == torch.float32
    message = ("triton_fa2 runs fp16 and bf16 attention, got a torch.float32 model; load it with dtype=torch.bfloat16 "
               "(or torch.float16), or convert it with model.to(torch.bfloat16)")
    with torch.no_grad(), pytest.raises(TypeError, match=re.escape(message)): model(torch.randint(0, 256, (1, 8), device=DEVICE))
    with torch.no_grad(): assert model.to(torch.bfloat16)(torch.randint(0, 256, (1, 8), device=DEVICE)).logits.isfinite().all()
    q, k = randn(1, 4, 5, 16).float(), randn(1, 2, 5, 16).float()
    with pytest.raises(TypeError, match="got a torch.float64 model"): hf.attention_forward(torch.nn.Module(), q.double(), k.double(), k.double())
    # weights in bf16 but a float32 query (a model that upcasts): the message about q, k, v dtypes is the right one
    with pytest.raises(TypeError, match="q, k, v must all be torch.float16 or all torch.bfloat16, got q torch.float32"):
        hf.attention_forward(model.model.layers[0].self_attn, q, k, k)


@pytest.mark.newest_triton_only
def test_compiled_model_with_masks_and_a_cache():
    "fullgraph compile of the whole model: no mask, right padding, a mask with a KV cache (greedy generation), and the checks."
    hf.register()
    model = tiny_llama()
    model.set_attn_implementation("triton_fa2")
    ids = torch.randint(0, 256, (2, 24), device=DEVICE)
    mask = torch.ones(2, 24, dtype=torch.long, device=DEVICE); mask[1, 15:] = 0
    left = torch.ones_like(mask); left[1, :9] = 0
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager" if DEVICE.type == "cpu" else "inductor")
    with torch.no_grad():
        for m in (None, mask):
            real = slice(None) if m is None else m.bool()          # padded positions: zeros eagerly, unread either way
            assert (compiled(ids, attention_mask=m).logits[real].float() - model(ids, attention_mask=m).logits[real].float()).abs().max() < 2e-2
        with pytest.raises(ValueError, match="right-padded batches only"): compiled(ids, attention_mask=left)
        # one decode step after a prefill, through the compiled model: the all-ones mask reaches attention_forward
        out = model(ids[:1, :8], use_cache=True)
        step = compiled(ids[:1, 8:9], attention_mask=torch.ones(1, 9, dtype=torch.long, device=DEVICE), past_key_values=out.past_key_values)
        full = model(ids[:1, :9]).logits[:, -1]
        assert (step.logits[:, -1].float() - full.float()).abs().max() < 2e-2


@pytest.mark.newest_triton_only
def test_padding_mask_function():
    "None when nothing is padded (eager), the sliced 2-D mask otherwise."
    m = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    assert hf.padding_mask(2, 4, 4, attention_mask=None) is None
    assert hf.padding_mask(2, 4, 4, attention_mask=torch.ones_like(m)) is None
    assert torch.equal(hf.padding_mask(2, 1, 3, attention_mask=m), m[:, -3:])


@pytest.mark.newest_triton_only
def test_register_without_transformers_names_the_extra():
    code = ("import sys; sys.modules['transformers'] = None\n"
            "import triton_fa2, triton_fa2.hf\n"
            "try:\n    triton_fa2.hf.register()\nexcept ImportError as e:\n    print('ERR', e)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "ERR" in run.stdout and "triton_fa2[hf]" in run.stdout, run.stdout + run.stderr


def train_steps(config_kwargs, implementation, steps=3, device=DEVICE, dtype=torch.bfloat16, seq=64, batch=2, left_pad=0):
    """A Llama built from a config with one seed, trained `steps` SGD steps with one attention: the losses and the last
    gradients. `left_pad`: the last sequence's first tokens are padding (masked, and no loss on them)."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(attention_dropout=0.0, **config_kwargs)
    model = transformers.LlamaForCausalLM(config).to(device=device, dtype=dtype).train()
    model.set_attn_implementation(implementation)
    ids = torch.randint(0, config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(1)).to(device)
    mask = torch.ones_like(ids); mask[-1, :left_pad] = 0
    labels = ids.masked_fill(mask == 0, -100)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = model(ids, attention_mask=mask if left_pad else None, labels=labels).loss
        loss.backward()
        losses.append(loss.item())
        grads = {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if "self_attn" in n}
        optimizer.step()
    return losses, grads


def check_training_matches_sdpa(config_kwargs, **kwargs):
    hf.register()
    ours, grads_ours = train_steps(config_kwargs, "triton_fa2", **kwargs)
    sdpa, grads_sdpa = train_steps(config_kwargs, "sdpa", **kwargs)
    assert all(abs(a - b) <= 2e-2 * abs(b) for a, b in zip(ours, sdpa)), (ours, sdpa)   # bf16 training, 3 steps
    for name in grads_sdpa:
        err = ((grads_ours[name] - grads_sdpa[name]).norm() / grads_sdpa[name].norm()).item()
        assert err < 5e-2, (name, err)
    return ours, sdpa


@pytest.mark.newest_triton_only
def test_tiny_llama_trains_like_sdpa():
    "Training mode, dropout 0: a few SGD steps give sdpa's losses, and the attention weights' gradients agree in bf16."
    check_training_matches_sdpa(dict(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2), seq=40)


@pytest.mark.newest_triton_only
def test_tiny_llama_trains_like_sdpa_on_a_padded_batch():
    "A left-padded batch in training: packed sequences forward and backward, sdpa's losses and gradients."
    check_training_matches_sdpa(dict(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2), seq=40, left_pad=13)


@pytest.mark.newest_triton_only
def test_a_left_padded_batch_generates_what_each_prompt_generates_alone():
    "Greedy generation of a left-padded batch (what generate builds for decoder models) with a KV cache: sdpa's tokens, and each prompt's alone."
    hf.register()
    model = tiny_llama()
    prompts = torch.randint(1, 256, (2, 10), device=DEVICE)
    mask = torch.ones_like(prompts); mask[1, :4] = 0
    run = lambda ids, m=None: model.generate(ids, attention_mask=m, max_new_tokens=6, do_sample=False, pad_token_id=0)[:, ids.shape[1]:]
    with torch.no_grad():
        model.set_attn_implementation("sdpa"); ref = run(prompts, mask)
        model.set_attn_implementation("triton_fa2"); ours, alone = run(prompts, mask), run(prompts[1:, 4:])
    assert torch.equal(ours, ref), (ours, ref)
    assert torch.equal(ours[1], alone[0]), (ours, alone)


@pytest.mark.newest_triton_only
def test_a_right_padded_batch_then_tokens_after_the_padding():
    """Right padding with a KV cache: after a prefill, new tokens come after the padding, so the cache's mask has holes.
    The new tokens' logits are sdpa's; greedy generation runs (its first token, read at a padded position, is
    meaningless for any implementation, as transformers warns)."""
    hf.register()
    model = tiny_llama()
    prompts = torch.randint(1, 256, (2, 10), device=DEVICE)
    mask = torch.ones_like(prompts); mask[1, 6:] = 0
    new = torch.randint(1, 256, (2, 2), device=DEVICE)
    logits = {}
    with torch.no_grad():
        for implementation in ("sdpa", "triton_fa2"):
            model.set_attn_implementation(implementation)
            cache = model(prompts, attention_mask=mask, use_cache=True).past_key_values
            step = model(new, attention_mask=torch.cat([mask, torch.ones_like(new)], 1), past_key_values=cache)
            logits[implementation] = step.logits.float()
        assert (logits["triton_fa2"] - logits["sdpa"]).abs().max() < 2e-2
        model.generate(prompts, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0)


@pytest.mark.newest_triton_only
def test_attention_dropout_is_refused_in_training():
    hf.register()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, attention_dropout=0.1)
    model = transformers.LlamaForCausalLM(config).to(device=DEVICE, dtype=torch.bfloat16).train()
    model.set_attn_implementation("triton_fa2")
    with pytest.raises(ValueError, match="does not implement attention dropout"): model(torch.randint(0, 256, (1, 8), device=DEVICE))


@pytest.mark.gpu
@pytest.mark.gpu_memory
def test_gpu_llama3_8b_shaped_training_matches_sdpa():
    "Llama-3-8B's attention shapes (hidden 4096, 32 query heads, 8 KV heads of 128), 2 layers, bf16, 4 × 1024 tokens."
    losses = check_training_matches_sdpa(dict(vocab_size=1024, hidden_size=4096, intermediate_size=14336, num_hidden_layers=2,
                                              num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096),
                                         seq=1024, batch=4)
    print("losses (triton_fa2, sdpa):", losses)


@pytest.mark.gpu
@pytest.mark.gpu_memory
def test_gpu_llama3_8b_shaped_padded_batch_matches_sdpa():
    "Llama-3-8B's attention shapes, 2 layers, bf16: a left-padded batch of 4 prompts, prefill logits on real tokens and greedy tokens as sdpa's."
    hf.register()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=1024, hidden_size=4096, intermediate_size=14336, num_hidden_layers=2,
                                      num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096)
    model = transformers.LlamaForCausalLM(config).to(device=DEVICE, dtype=torch.bfloat16).eval()
    ids = torch.randint(1, 1024, (4, 600), device=DEVICE)
    mask = torch.ones_like(ids)
    for b, pad in enumerate((0, 17, 250, 599)): mask[b, :pad] = 0
    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        ref, gen_ref = model(ids, attention_mask=mask).logits.float(), model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
        model.set_attn_implementation("triton_fa2")
        ours, gen = model(ids, attention_mask=mask).logits.float(), model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    real = mask.bool()
    assert (ours[real] - ref[real]).abs().max() < 5e-2 * ref[real].abs().max()
    assert (gen == gen_ref).float().mean() > 0.95, (gen, gen_ref)   # bf16: a near-tie may flip a token, rarely


def _tiny(name, **extra):
    "A 2-layer model of one family from a config, fp16, eval mode; sliding windows shorter than the prompts."
    common = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=128)
    config = getattr(transformers, name + "Config")(**common, **extra)
    torch.manual_seed(0)
    return getattr(transformers, name + "ForCausalLM")(config).to(device=DEVICE, dtype=torch.float16).eval()


@pytest.mark.newest_triton_only
@pytest.mark.parametrize("name, extra, passed", [
    ("Mistral", dict(sliding_window=7), {"sliding_window"}),                              # every layer windowed
    ("Gemma2", dict(sliding_window=6, attn_logit_softcapping=20.0, final_logit_softcapping=None,
                    query_pre_attn_scalar=16), {"sliding_window", "softcap"}),           # softcap; windowed and full layers
    ("GptOss", dict(sliding_window=5, num_local_experts=2, num_experts_per_tok=1,
                    layer_types=["sliding_attention", "full_attention"]), {"sliding_window", "s_aux"}),   # sinks and windows
])
def test_windowed_softcapped_and_sink_models_match_eager(name, extra, passed, monkeypatch):
    "Mistral-, Gemma-2- and gpt-oss-shaped models: logits as eager attention's, and greedy generation the same tokens."
    hf.register()
    seen = []
    real = hf.attention_forward
    monkeypatch.setitem(transformers.AttentionInterface._global_mapping, "triton_fa2",
                        lambda *a, **kw: seen.append({n for n in ("sliding_window", "softcap", "s_aux") if kw.get(n) is not None}) or real(*a, **kw))
    model = _tiny(name, **extra)
    ids = torch.randint(0, 256, (2, 20), device=DEVICE)
    with torch.no_grad():
        model.set_attn_implementation("eager"); ref = model(ids).logits.float()
        gen_ref = model.generate(ids[:1, :6], max_new_tokens=10, do_sample=False)
        model.set_attn_implementation("triton_fa2"); ours = model(ids).logits.float()
        gen = model.generate(ids[:1, :6], max_new_tokens=10, do_sample=False)
    assert set().union(*seen) == passed, f"the model passed {set().union(*seen)}, not {passed}"
    assert (ours - ref).abs().max().item() < 2e-2
    assert torch.equal(gen, gen_ref)
    with torch.no_grad():                      # a left-padded batch (as generate pads): the real tokens as the prompt alone
        left = torch.ones(2, 20, dtype=torch.long, device=DEVICE); left[1, :7] = 0
        padded = model(ids, attention_mask=left).logits[1, 7:].float()
        assert (padded - model(ids[1:, 7:]).logits[0].float()).abs().max().item() < 2e-2
    # a training step: every parameter's gradient (gpt-oss's sinks included) as eager attention's in float32
    reference = copy.deepcopy(model).float()
    reference.set_attn_implementation("eager")
    reference(ids, labels=ids).loss.backward()
    model(ids, labels=ids).loss.backward()
    expected = {n: p.grad for n, p in reference.named_parameters() if p.grad is not None}
    assert name != "GptOss" or any(n.endswith("sinks") for n in expected)
    for n, p in model.named_parameters():
        if n not in expected: continue
        assert p.grad is not None and not p.grad.isnan().any(), n
        err = ((p.grad.float() - expected[n]).norm() / expected[n].norm().clamp_min(1e-6)).item()
        assert err < 3e-2, f"{n}: relative error {err:.3g}"
