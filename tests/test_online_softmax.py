"online_softmax, its update and merge against torch.softmax / torch.logsumexp in float64, on random and adversarial rows."
import pytest
import torch

from triton_fa2.online_softmax import merge_softmax_states, online_softmax, online_softmax_update

pytestmark = pytest.mark.newest_triton_only   # PyTorch only, no Triton kernel: not run again on another Triton (.ci/run)

inf = float("inf")

# dtype → (atol, rtol) for probabilities in [0, 1] against float64. The computation is float32 (float64 for float64),
# so the error is the final rounding to the output dtype: half an ulp, 2⁻¹¹ relative in fp16, 2⁻⁸ in bf16.
TOL = {
    torch.float16:  (1e-5, 1e-3),
    torch.bfloat16: (1e-5, 8e-3),
    torch.float32:  (1e-7, 1e-5),
    torch.float64:  (1e-14, 1e-10),
}
DTYPES = list(TOL)


def assert_probs(p, x):
    "p is softmax(x) within TOL[p.dtype]: same dtype and shape as x, no NaN (assert_close does not let NaN pass)."
    assert p.dtype == x.dtype and p.shape == x.shape
    atol, rtol = TOL[p.dtype]
    expected = torch.softmax(x.double(), dim=-1)
    expected = expected.nan_to_num(0.0)  # torch gives NaN on rows with no finite score; the convention is 0
    torch.testing.assert_close(p.double(), expected, atol=atol, rtol=rtol)


def stream(x, block_size, order=None):
    "Final (m, l) of streaming the last dim of x through online_softmax_update, blocks in `order` (default left to right)."
    m, l = x.new_full(x.shape[:-1], -inf), x.new_zeros(x.shape[:-1])
    starts = list(range(0, x.shape[-1], block_size))
    for i in (order if order is not None else range(len(starts))):
        m, l = online_softmax_update(m, l, x[..., starts[i]:starts[i] + block_size])
    return m, l


@pytest.mark.parametrize("shape", [
    (1,),          # a single score: one block, p = 1
    (17,),         # odd length: the last block is partial for every block size but 1
    (3, 1000),     # long rows, batched: many rescales with small blocks
    (2, 3, 65),    # 3-d batch; one past a multiple of 64: a last block of one score
    (4, 0),        # empty rows: no block at all, an empty result
])
@pytest.mark.parametrize("block_size", [
    1,             # every score is its own block: a rescale at every new max
    7,             # odd block, never divides the lengths
    64,            # a kernel-like block
    4096,          # bigger than every row: the two-pass softmax
])
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_torch_softmax(shape, block_size, dtype):
    x = (torch.randn(*shape, dtype=torch.float64) * 3).to(dtype)
    assert_probs(online_softmax(x, block_size), x)


def _adversarial(kind, n=50):
    "One row of n scores per kind (float64; cast by the caller)."
    x = torch.randn(n, dtype=torch.float64)
    if kind == "all_masked":       x[:] = -inf
    elif kind == "one_finite":     x[:] = -inf; x[37] = 0.3
    elif kind == "huge":           x = torch.randn(n, dtype=torch.float64).sign() * 1e4 + torch.arange(n)
    elif kind == "past_exp_limit": x = 100 + 5 * x
    elif kind == "mixed_masked":   x[torch.randperm(n)[:40]] = -inf
    elif kind == "masked_prefix":  x[:48] = -inf
    elif kind == "ties":           x[:] = 7.0
    return x


@pytest.mark.parametrize("kind", [
    "all_masked",      # every score −inf: m stays −inf, l = 0, probabilities 0 (torch.softmax gives NaN)
    "one_finite",      # one finite score among −inf: one-hot, l = 1
    "huge",            # ±1e4: exp overflows even float64 unless taken relative to the max
    "past_exp_limit",  # scores near 100: exp overflows float32 (and fp16 past 11.09) without the max
    "mixed_masked",    # −inf spread over every block, next to finite scores
    "masked_prefix",   # the first blocks all −inf: the stand-in for m = −inf carries the state through them
    "ties",            # all equal: the max is hit in every block, uniform 1/n
])
@pytest.mark.parametrize("dtype", DTYPES)
def test_adversarial_rows(kind, dtype):
    x = _adversarial(kind).to(dtype)
    p = online_softmax(x, block_size=16)  # 50 = 3·16 + 2: a partial last block
    assert_probs(p, x)
    if kind == "all_masked": assert (p == 0).all()
    else: torch.testing.assert_close(p.double().sum(), torch.tensor(1.0, dtype=torch.float64), atol=0, rtol=TOL[dtype][1])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_state_is_not_kept_in_half_precision(dtype):
    "4096 terms near 1, one at a time: a sum kept in fp16 stalls at 2048 (bf16: at 256), giving p four to sixteen times too big."
    x = (torch.randn(2, 4096) * 1e-2).to(dtype)
    assert_probs(online_softmax(x, block_size=1), x)


@pytest.mark.parametrize("N, block_size", [
    (1, 1),        # one score
    (17, 4),       # partial last block
    (1000, 7),     # many blocks
    (300, 512),    # one block bigger than the row
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_final_state_is_max_and_sum(N, block_size, dtype):
    x = (torch.randn(5, N, dtype=torch.float64) * 3).to(dtype)
    x[1, : max(N // 2, 1)] = -inf  # leading masked scores (all of row 1 when N = 1)
    m, l = stream(x, block_size)
    assert m.dtype == l.dtype == dtype
    mx = x.amax(-1)
    torch.testing.assert_close(m, mx)  # the max is exact
    atol, rtol = TOL[dtype]
    expected = torch.exp(x.double() - mx.double().nan_to_num(neginf=0.0)[:, None]).sum(-1)
    torch.testing.assert_close(l.double(), expected, atol=atol, rtol=rtol)


def test_all_masked_state_is_minus_inf_and_zero():
    "−inf − (−inf) is NaN: without the stand-in the first masked block poisons the state, and every later one."
    m, l = torch.full((3,), -inf), torch.zeros(3)
    m, l = online_softmax_update(m, l, torch.full((3, 8), -inf))
    assert m.isneginf().all() and (l == 0).all()
    m, l = online_softmax_update(m, l, torch.tensor([[1.0, -inf], [-inf, -inf], [0.5, 2.0]]))
    torch.testing.assert_close(m, torch.tensor([1.0, -inf, 2.0]))
    torch.testing.assert_close(l, torch.tensor([1.0, 0.0, 1 + torch.exp(torch.tensor(-1.5)).item()]))


def test_block_order_does_not_matter():
    "Blocks in any order give the same state: the max grows in different steps, the rescales compensate."
    x = torch.randn(4, 480, dtype=torch.float64) * 4
    x[0, 100:300] = -inf  # masked blocks in the middle
    m_ref, l_ref = stream(x, 32)
    for _ in range(3):
        m, l = stream(x, 32, order=torch.randperm(15).tolist())
        torch.testing.assert_close(m, m_ref); torch.testing.assert_close(l, l_ref, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("cut", [
    1,      # part a is a single score
    150,    # halves
    299,    # part b is a single score
])
@pytest.mark.parametrize("masked", [
    None,   # both parts finite
    "a",    # part a fully masked: merge with the empty state (−inf, 0) changes nothing
    "both", # the whole row masked: (−inf, 0), not NaN
])
def test_merge_halves_equals_whole(cut, masked):
    x = torch.randn(5, 300, dtype=torch.float64) * 3
    if masked == "a": x[:, :cut] = -inf
    if masked == "both": x[:] = -inf
    m_ref, l_ref = stream(x, 300)
    (ma, la), (mb, lb) = stream(x[:, :cut], 16), stream(x[:, cut:], 16)
    for m, l in (merge_softmax_states(ma, la, mb, lb), merge_softmax_states(mb, lb, ma, la)):  # either order
        assert not (m.isnan().any() or l.isnan().any())
        torch.testing.assert_close(m, m_ref); torch.testing.assert_close(l, l_ref, atol=1e-12, rtol=1e-12)


def test_lse_from_state_and_merge_of_lses():
    "LSE = m + log l, −inf for a fully masked row; (LSE, 1) is a state, and merging two is logaddexp."
    x = torch.randn(4, 200, dtype=torch.float64) * 3
    x[0] = -inf; x[1, :100] = -inf
    m, l = stream(x, 32)
    lse = m + torch.log(l)
    torch.testing.assert_close(lse, torch.logsumexp(x, dim=-1))  # compares row 0's −inf as well
    (ma, la), (mb, lb) = stream(x[:, :100], 32), stream(x[:, 100:], 32)
    one = torch.ones(4, dtype=torch.float64)
    mm, ll = merge_softmax_states(ma + torch.log(la), one, mb + torch.log(lb), one)
    torch.testing.assert_close(mm + torch.log(ll), lse)


@pytest.mark.parametrize("block_size", [0, -3, 2.0, True, None])
def test_bad_block_size(block_size):
    with pytest.raises(ValueError, match="block_size must be an int ≥ 1"):
        online_softmax(torch.randn(3, 5), block_size)


@pytest.mark.parametrize("x", [torch.arange(5), torch.ones(5, dtype=torch.bool), [0.0, 1.0]])
def test_non_float_input(x):
    with pytest.raises(TypeError, match="floating-point"):
        online_softmax(x)
