"""Models for the end-to-end tests, one per scenario of the core issue."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

RELU = "torch.ops.aten.relu.default"


class ConvBnRelu(nn.Module):
    """The seed scenario: conv -> batchnorm -> relu stacks, then a multi-output engine."""

    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, channels, 3, padding=1)
        self.b1 = nn.BatchNorm2d(channels)
        self.c2 = nn.Conv2d(channels, channels, 3, padding=1)
        self.b2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.relu(self.b1(self.c1(x)))
        x = torch.relu(self.b2(self.c2(x)))
        a, b = x.chunk(2, dim=1)
        scaled = a * 2
        return torch.relu(scaled) + b, scaled


class Residual(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + x)


class TinyResNet(nn.Module):
    """ResNet-style: stem, three residual blocks, pooled linear head."""

    def __init__(self, channels: int = 8, classes: int = 5) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.blocks = nn.Sequential(*(Residual(channels) for _ in range(3)))
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(torch.relu(self.stem(x)))
        return self.head(x.mean(dim=(2, 3)))


class EdgesFallBack(nn.Module):
    """First and last op fall back; the engine also reads the graph input directly."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(x)
        z = self.conv(y) + x * 0.5
        return torch.sigmoid(z)


class MultiOutputBothSides(nn.Module):
    """chunk inside an engine, topk in a fallback; both feed later blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = self.lin(x).chunk(2, dim=-1)
        values, indices = torch.topk(a, k=3, dim=-1)
        left, right = b.split([5, 3], dim=-1)
        return values * 2 + right, indices + left.sum(dim=-1, keepdim=True).long()


class Chain(nn.Module):
    """Four linear layers, relu, sigmoid, relu between: partitioned differently by which of them fall back."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.layers[0](x))
        x = torch.sigmoid(self.layers[1](x))
        x = torch.relu(self.layers[2](x))
        result: torch.Tensor = self.layers[3](x)
        return result


class HalfOverflow(nn.Module):
    """A half-precision linear whose product overflows on an input of 2.0 (64 * 600 * 2 = 76800 > 65504)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(64, 8).half()
        nn.init.constant_(self.linear.weight, 600.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x)) - 1.0


class _Cached(nn.Module):
    """An inference model with a cache buffer of ``rows`` rows (torch 2.5's export refuses a buffer write carrying a
    gradient, so nothing requires one)."""

    def __init__(self, rows: int) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.register_buffer("cache", torch.zeros(rows, 4))
        self.requires_grad_(False)


class RunningCache(_Cached):
    """A forward that updates a buffer as it runs (a cache): each call reads what the one before it left."""

    def __init__(self) -> None:
        super().__init__(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        out = torch.relu(y) + torch.relu(self.cache).sum(0)  # with relu falling back, read from the buffer itself
        self.cache.mul_(0.5).add_(y[:2])
        return out


class ReturnsCache(_Cached):
    """A forward that updates its cache and returns it (present key/values): an output that is the buffer itself."""

    def __init__(self) -> None:
        super().__init__(3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.relu(self.linear(x))
        self.cache.add_(y)
        return y, self.cache


class CrossedHalves(nn.Module):
    """Three engines, each returning two halves; a relu between them reads one half, the next engine both.

    Partitioned with relu left to PyTorch, the second relu's fallback names its
    input ``getitem_3`` (the graph's own getitem), while the engine output it
    reads is the parent's ``getitem_2``; the parent's ``getitem_3`` is the other
    half, defined earlier and of the same shape. Name matching (releases up to
    2.13) wires that half: the file lints, loads and computes a wrong tensor.
    """

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second, self.last = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.first(x).chunk(2, dim=-1)
        c, d = self.second(torch.cat([torch.relu(a), b], -1)).chunk(2, dim=-1)
        return self.last(torch.cat([torch.relu(d), c], -1))


class TaggedTensor(torch.Tensor):
    """A tensor subclass: torch.export.save pickles such constants (``use_pickle``); loading one runs its class."""


# ---------------------------------------------------------------------------
# Scalars crossing engine boundaries (dynamic shapes)
# ---------------------------------------------------------------------------


class ScalarOut(nn.Module):
    """An engine computes a size (rows - 1); arange falls back and consumes it; a later engine combines."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * 2.0 + 1.0
        n = h.shape[0] - 1
        r = torch.arange(n, dtype=x.dtype)
        return h[1:] * r.unsqueeze(1) + 0.5


class ScalarIn(nn.Module):
    """A data-dependent item() falls back, bounded with torch._check; an engine takes it first, as arange's end."""

    def forward(self, x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        n = k.sum().item()
        torch._check(n >= 1)
        torch._check(n <= 16)
        idx = torch.arange(n, dtype=torch.float32)
        return idx.sum() + x * 2.0


class SymArith(nn.Module):
    """SymInt arithmetic inside an engine (rows - 1) feeds a fallback slice."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(x) * 3.0
        end = y.shape[0] - 1
        return y[0:end] + 1.0


@dataclass
class ScalarCase:
    """A model whose partition has a scalar crossing an engine boundary, with sizes at both ends of its range."""

    name: str
    model: nn.Module
    inputs: tuple[torch.Tensor, ...]
    dynamic_shapes: tuple[Any, ...]
    torch_executed_ops: list[str]
    # Inputs at the low end, the middle and the high end of the declared range.
    checks: list[tuple[torch.Tensor, ...]]
    # Which way the scalar crosses: "output" (an engine returns it) or "input" (an engine takes it first).
    crossing: str


def _counts(count: int) -> torch.Tensor:
    return (torch.arange(16) < count).long()


def scalar_cases() -> list[ScalarCase]:
    dim = torch.export.Dim
    return [
        ScalarCase(
            "scalar_output",
            ScalarOut(),
            (torch.randn(6, 4),),
            ({0: dim("rows", min=3, max=16)},),
            ["aten.arange"],
            [(torch.randn(n, 4),) for n in (3, 9, 16)],
            "output",
        ),
        ScalarCase(
            "scalar_input",
            ScalarIn(),
            (torch.randn(16), _counts(6)),
            ({0: dim("length", min=1, max=16)}, None),
            ["aten._local_scalar_dense", "aten.item"],
            [(torch.randn(m), _counts(c)) for m, c in ((1, 1), (7, 5), (16, 16))],
            "input",
        ),
        ScalarCase(
            "symint_arithmetic",
            SymArith(),
            (torch.randn(6, 8),),
            ({0: dim("rows", min=3, max=16)},),
            ["aten.slice"],
            [(torch.randn(n, 8),) for n in (3, 7, 16)],
            "output",
        ),
    ]


class RowsAndValues(nn.Module):
    """Returns a Python int computed in an engine (rows - 1) next to a tensor: the package must give an int too."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        h = torch.relu(x) * 2.0
        return h + 1.0, h.shape[0] - 1


class ExpandedIds(nn.Module):
    """An engine whose output is an expanded view (strides 0), read by a falling-back embedding (BERT-like)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 8)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        expanded = (ids[:1] * 1).expand(ids.shape[0], ids.shape[1])
        return self.emb(expanded) * 2.0


class HalfSlice(nn.Module):
    """An engine computes ``h.shape[1] // 2`` of a derived size (``2 * half``); a falling-back slice reads it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * 2.0
        return torch.relu(h[:, 0 : h.shape[1] // 2])


# Without the size-oblivious flag (torch 2.6 and before) a size read back from an engine stays an unbacked
# symbol that slice/expand decompositions guard on, and a Dim(min=1) equated with it narrows to 2.
SIZE_OBLIVIOUS_REASON = (
    f"torch {torch.__version__} traces without size-oblivious sizes (2.7.1+): a scalar of a derived Dim or "
    "of a Dim(min=1) crossing an engine boundary cannot be re-exported"
)
# From 2.7 torch has the size-oblivious flag, but before DERIVED_SCALARS_FROM its slice decomposition
# still guards on an engine's unbacked size scalar (GuardOnDataDependentSymNode in slice_forward), and
# 2.8 cannot serialize a SymBool cast (cast_symbool_to_symint_guardless): measured on 2.7.1, 2.8.0 and 2.9.1.
DERIVED_SCALARS_FROM = (2, 10)


def derived_scalars_skip() -> str | None:
    """Why this torch cannot re-export a derived Dim's scalar crossing an engine boundary; None where it can."""
    from support.pairs import minor
    from trt_inline import compat

    if not compat.traces_size_obliviously():
        return SIZE_OBLIVIOUS_REASON
    if minor(torch.__version__) < DERIVED_SCALARS_FROM:
        return (
            f"torch {torch.__version__} guards on an engine's unbacked size scalar in slice_forward (fixed by "
            f"{'.'.join(map(str, DERIVED_SCALARS_FROM))}): a scalar of a derived Dim read by a falling-back slice "
            "cannot be re-exported"
        )
    return None


AOTI_REBIND_REASON = (
    f"AOTInductor before torch 2.13 (here {torch.__version__}) cannot recompile a slice sized by a scalar an "
    "engine returns when that scalar equals an input size (rebind_unbacked)"
)


def derived_dim_case() -> ScalarCase:
    """:class:`HalfSlice` with ``x.shape[1] = 2 * half``, half in 2 ... 16, slice falling back."""
    half = torch.export.Dim("half", min=2, max=16)
    return ScalarCase(
        "derived_dim",
        HalfSlice(),
        (torch.randn(3, 8),),
        ({1: 2 * half},),
        ["aten.slice.Tensor"],
        [(torch.randn(3, 2 * n),) for n in (2, 7, 16)],
        "output",
    )


class SharedDimInputs(nn.Module):
    """Two inputs sharing a ``Dim`` (ids and mask, as every Hugging Face model has), the mask product falling back."""

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.relu(ids * 2.0) * mask


class FlattenRows(nn.Module):
    """``h.view(h.shape[0], -1)`` with ``view`` falling back: the batch size crosses an engine boundary."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * 2.0
        return torch.relu(h.view(h.shape[0], -1))


class TransformerBlock(nn.Module):
    """A pre-norm transformer block: multi-head self-attention (``scaled_dot_product_attention``, which lowers
    to the efficient, flash or cuDNN kernel on CUDA) and an MLP, each residual.

    ``dropout``: after the attention, active only in training mode (an eval block draws nothing).
    """

    def __init__(self, width: int = 32, heads: int = 4, dropout: float = 0.0) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.project = nn.Linear(width, width)
        self.drop = nn.Dropout(dropout)
        self.norm2 = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(batch, tokens, 3, self.heads, width // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        attended = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        x = x + self.drop(self.project(attended.transpose(1, 2).reshape(batch, tokens, width)))
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


class Calls(nn.Module):
    """A model whose forward is ``fn`` (a lambda over its inputs): one layer or one group of functions."""

    def __init__(self, fn: Any) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *inputs: torch.Tensor) -> Any:
        return self.fn(*inputs)


def operator_survey() -> list[tuple[str, nn.Module, tuple[torch.Tensor, ...]]]:
    """Layers and functions eval-mode models are built from, with their inputs: what the allow-list walk exports.

    Every common layer of ``torch.nn`` (convolutions, normalizations, pooling, resampling, recurrent, attention,
    embeddings) and the tensor functions models call (activations, reductions, shapes, indexing, creation,
    matrix products, losses). Not circular padding: it lowers to ``empty`` filled region by region, which verify
    refuses (uninitialized memory; SECURITY.md).
    """
    import torch.nn.functional as F

    from support.pairs import minor

    x4, x3, x2 = torch.randn(2, 3, 16, 16), torch.randn(2, 5, 32), torch.randn(4, 32)
    ids = torch.tensor([[1, 2], [3, 4]])
    zeros = torch.zeros(2, 5, 1, dtype=torch.long)
    return [
        ("linear", nn.Linear(32, 8), (x2,)),
        ("conv1d", nn.Conv1d(5, 4, 3), (torch.randn(2, 5, 9),)),
        ("conv3d", nn.Conv3d(3, 4, 3), (torch.randn(1, 3, 6, 6, 6),)),
        ("conv_transpose", nn.ConvTranspose2d(3, 4, 3, stride=2), (x4,)),
        ("group_norm", nn.GroupNorm(1, 3), (x4,)),
        ("instance_norm", nn.InstanceNorm2d(3, affine=True), (x4,)),
        ("layer_norm", nn.LayerNorm(32), (x3,)),
        ("batch_norm_1d", nn.BatchNorm1d(5), (x3,)),
        ("batch_norm_3d", nn.BatchNorm3d(3), (torch.randn(1, 3, 4, 4, 4),)),
        ("embedding", nn.Embedding(10, 4), (ids,)),
        ("embedding_bag", nn.EmbeddingBag(10, 4), (ids,)),
        ("prelu", nn.PReLU(), (x3,)),
        ("glu", nn.GLU(), (x3,)),
        ("gru", nn.GRU(32, 8, batch_first=True), (x3,)),
        ("rnn", nn.RNN(32, 8, batch_first=True), (x3,)),
        ("lstm", nn.LSTM(32, 8, num_layers=2, batch_first=True, bidirectional=True), (x3,)),
        ("dropouts", nn.Sequential(nn.Dropout(0.1), nn.Dropout2d(0.1), nn.AlphaDropout(0.1)), (x4,)),
        ("activations", Calls(lambda x: (
            F.gelu(x) + F.silu(x) + F.hardswish(x) + F.hardsigmoid(x) + F.mish(x) + F.relu6(x) + F.softplus(x)
            + F.elu(x) + F.selu(x) + F.celu(x) + F.leaky_relu(x) + F.logsigmoid(x) + torch.tanh(x) + torch.sigmoid(x)
            + F.gelu(x, approximate="tanh") + F.hardtanh(x) + F.softsign(x) + F.tanhshrink(x) + F.hardshrink(x)
            + F.softshrink(x) + F.softmax(x, -1) + F.log_softmax(x, -1) + torch.logsumexp(x, -1, keepdim=True)
        )), (x3,)),
        ("pooling", Calls(lambda x: (
            F.max_pool2d(x, 2), F.avg_pool2d(x, 2), F.adaptive_avg_pool2d(x, 3), F.adaptive_max_pool2d(x, 3),
            F.lp_pool2d(x, 2, 2), F.max_pool1d(x[:, 0], 2), F.avg_pool1d(x[:, 0], 2), F.adaptive_avg_pool1d(x[:, 0], 3)
        )), (x4,)),
        ("resampling", Calls(lambda x: (
            F.interpolate(x, scale_factor=2, mode="nearest"), F.interpolate(x, scale_factor=2, mode="bilinear"),
            F.interpolate(x, size=(5, 7), mode="bicubic"), F.pixel_shuffle(x.repeat(1, 4, 1, 1), 2),
            F.pixel_unshuffle(x, 2), F.pad(x, (1, 1, 1, 1)), F.pad(x, (1, 1, 1, 1), mode="reflect"),
            F.pad(x, (1, 1, 1, 1), mode="replicate"),
            F.grid_sample(x, torch.zeros(2, 4, 4, 2), align_corners=False)
        )), (x4,)),
        ("shapes", Calls(lambda x: torch.cat([
            x.flatten(1), x.reshape(2, -1), x.view(2, -1).contiguous(), x.transpose(1, 2).reshape(2, -1),
            x.permute(0, 2, 1).reshape(2, -1), torch.stack(x.chunk(2, -1), 0).reshape(2, -1),
            x.split(16, -1)[0].repeat(1, 1, 2).reshape(2, -1), x.roll(1, 1).reshape(2, -1), x.flip(1).reshape(2, -1),
            x.unbind(1)[0].repeat(1, 5), x.narrow(2, 0, 32).reshape(2, -1), x.expand(2, 5, 32).reshape(2, -1),
            torch.tile(x, (1, 1, 1)).reshape(2, -1), x.repeat_interleave(1, 0).reshape(2, -1),
            x.unflatten(2, (4, 8)).reshape(2, -1), x.mT.reshape(2, -1), x.movedim(1, 2).reshape(2, -1),
        ], 1)), (x3,)),
        ("pointwise", Calls(lambda x: (
            x.abs() + x.exp() + x.clamp(-1, 1) + x.clamp_min(0) + x.clamp_max(1) + torch.where(x > 0, x, 0.0)
            + x.masked_fill(x > 1, 0.0) + x.sqrt().nan_to_num() + x.pow(2) + x.square() + (1 - x) + x // 2 + x % 3
            + x.sign() + x.round() + x.floor() + x.ceil() + x.trunc() + x.frac() + torch.erf(x) + torch.lerp(x, x, 0.5)
            + torch.addcmul(x, x, x) + torch.addcdiv(x, x, x.abs() + 1) + torch.atan2(x, x) + torch.hypot(x, x)
            + torch.logaddexp(x, x) + x.log1p().nan_to_num() + x.type_as(x) + x.to(torch.float64).float() + x.sin()
        )), (x3,)),
        ("reductions", Calls(lambda x: (
            x.sum(), x.mean(-1), x.std(-1), x.var(-1), torch.var_mean(x, -1)[0], x.amax(-1), x.amin(-1),
            x.max(-1).values, x.min(-1)[1], x.argmax(-1), x.argmin(-1), x.norm(dim=-1), x.prod(-1), x.any(-1),
            x.topk(3).values, x.sort(-1).values, x.argsort(-1), x.median(-1).values, x.count_nonzero(-1),
            x.cumsum(-1), x.cumprod(-1), F.normalize(x, dim=-1), F.cosine_similarity(x, x, dim=-1), torch.cdist(x, x)
        )), (x3,)),
        ("products", Calls(lambda x: (
            x @ x.mT, torch.bmm(x, x.mT), torch.baddbmm(x @ x.mT, x, x.mT), torch.einsum("bij,bkj->bik", x, x),
            torch.outer(x[0, 0], x[0, 0]), torch.addmm(x[0, 0:1, 0:5], x[0], x[0].T)
        )), (x3,)),
        ("indexing", Calls(lambda x: (
            x[:, [0, 2]], x[:, 1:3, ::2], x.gather(-1, zeros), x.index_select(1, torch.tensor([0, 1])),
            torch.zeros_like(x).scatter(-1, zeros, 1.0), torch.zeros_like(x).scatter_add(-1, zeros, x[..., :1]),
            x.index_put((torch.tensor([0]),), torch.tensor(1.0)), x.masked_select(x > 0).sum(),
            torch.bucketize(x, torch.tensor([0.0, 1.0])), torch.tril(x), torch.triu(x), x.unfold(2, 4, 4),
            F.one_hot(torch.tensor([1, 2]), 4), x.int() & 3, x.int() | 1, ~(x > 0), torch.logical_and(x > 0, x < 1)
        )), (x3,)),
        ("creation", Calls(lambda x: (
            torch.ones(3), torch.zeros(2, 3), torch.full((2,), 3.0), torch.arange(5), torch.ones_like(x),
            x.new_zeros(3), x.new_ones(3), x.new_full((3,), 2.0), torch.eye(3), torch.linspace(0, 1, 5)
        )), (x3,)),
        ("losses", Calls(lambda x: (
            F.cross_entropy(x[:, 0], torch.tensor([1, 2])), F.mse_loss(x, x), F.l1_loss(x, x),
            F.smooth_l1_loss(x, x), F.binary_cross_entropy_with_logits(x, x.sigmoid()),
            F.kl_div(x.log_softmax(-1), x.softmax(-1), reduction="batchmean")
        )), (x3,)),
        ("complex_and_fft", Calls(lambda x: (
            torch.view_as_real(torch.view_as_complex(x.reshape(2, 5, 16, 2)) * 2), torch.fft.rfft(x).abs()
        )), (x3,)),
        # torch 2.5's export cannot decompose nn.MultiheadAttention's batch-first path (TransformerBlock calls
        # scaled_dot_product_attention itself, and is exported on every torch).
        *([("encoder_layer", nn.TransformerEncoderLayer(32, 4, 64, batch_first=True), (x3,))]
          if minor(torch.__version__) >= (2, 6) else []),
    ]  # fmt: skip


class Square(nn.Module):
    """``h * h / 1e5``: about 1e5 in between for inputs of about 300, past fp16's range (65504)."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        big = h * h
        return big / 1e5


class Fp16Overflow(nn.Module):
    """An activation past the fp16 range (about 1e5) inside the submodule ``spot``, brought back to about 1 there:
    what an fp16 build loses where fp32 does not; keeping ``spot`` in fp32 fixes it (tests/reference/test_precision.py,
    tests/fixing/test_find_fix.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(16, 16)
        self.spot = Square()
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x) * 300.0
        small = self.spot(h)
        return self.head(torch.relu(small) + 1)


class _LongMean(nn.Module):
    def forward(self, values: torch.Tensor) -> torch.Tensor:
        total = (values + 20.0).sum(-1, keepdim=True)
        return total / 4096.0 - 20.0


class LongSum(nn.Module):
    """A sum over 4096 values of about 20 (about 8e4, past the fp16 range) that the next node turns into a mean,
    in the submodule ``mean``: an fp16 build stores the sum as inf (tests/fixing/test_find_fix.py; the benchmark's
    spot of the same name)."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(16, 4096)
        self.mean = _LongMean()
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x + self.mean(self.up(x)))


class _ShiftedSoftmax(nn.Module):
    def forward(self, projected: torch.Tensor) -> torch.Tensor:
        logits = projected * 8.0 + 1000.0
        return torch.softmax(logits, dim=-1) * 8.0


class LargeLogits(nn.Module):
    """Logits near 1000 with a spread of a few units, in the submodule ``logits``: fp16 keeps them to 0.5, and the
    softmax reads them so."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.logits = _ShiftedSoftmax()
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.logits(self.proj(x)))


class _Offset(nn.Module):
    def forward(self, projected: torch.Tensor) -> torch.Tensor:
        values = projected * 0.05 + 100.0
        return values


class LargeMeanNorm(nn.Module):
    """Values of 100 ± 0.05 (the submodule ``offset``), stored in fp16 (to 1/16) before a LayerNorm divides by their
    spread: keeping ``offset`` and ``norm`` in fp32 fixes it (the LayerNorm would otherwise read them in fp16)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.offset = _Offset()
        self.norm = nn.LayerNorm(16)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.offset(self.proj(x))))


class _Depthwise(nn.Module):
    """MobileNet's block: depthwise convolution, batch norm, hardswish, pointwise convolution, batch norm, relu."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.depthwise = nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False)
        self.bn1, self.act = nn.BatchNorm2d(cin), nn.Hardswish()
        self.pointwise, self.bn2 = nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn2(self.pointwise(self.act(self.bn1(self.depthwise(x))))))


class SmallMobileNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, 2, 1)
        self.blocks = nn.Sequential(_Depthwise(8, 16, 2), _Depthwise(16, 16, 1))
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(nn.functional.hardswish(self.stem(x))).mean(dim=(2, 3)))


class SmallEncoder(nn.Module):
    """The first-hour benchmark's encoder at a test's size: patches (ViT) or tokens (BERT; causal: GPT-2), two
    transformer encoder layers with GELU, a head."""

    def __init__(self, patches: bool, causal: bool = False) -> None:
        super().__init__()
        self.patches, self.causal = patches, causal
        self.embed = nn.Conv2d(3, 32, 8, 8) if patches else nn.Embedding(100, 32)
        self.position = nn.Parameter(torch.randn(1, 16, 32) * 0.02)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(32, 4, 64, activation="gelu", batch_first=True, dropout=0.0) for _ in range(2)
        )
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x).flatten(2).transpose(1, 2) if self.patches else self.embed(x)
        h = h + self.position[:, : h.shape[1]]
        mask = nn.Transformer.generate_square_subsequent_mask(h.shape[1]) if self.causal else None
        for layer in self.layers:
            h = layer(h, src_mask=mask, is_causal=self.causal)
        return self.head(h)


class LstmClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(100, 16)
        self.lstm = nn.LSTM(16, 32, batch_first=True)
        self.head = nn.Linear(32, 10)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(tokens))
        return self.head(torch.relu(out[:, -1]))


class NormMlp(nn.Module):
    """An MLP with a LayerNorm and a softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.norm, self.b = nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.b(torch.relu(self.norm(self.a(x)))), -1)


def release_survey() -> list[tuple[str, nn.Module, tuple[torch.Tensor, ...], dict[str, Any]]]:
    """The models rehearsed against a release's own dry run (tests/reference/test_release_pipeline.py): the
    architectures of
    the first-hour benchmark at a test's size, the examples' models, the fix benchmark's planted spots; each with
    the compile settings of its scenario (the seed scenario's ``relu`` falling back)."""
    torch.manual_seed(0)
    image, tokens = torch.randn(2, 3, 32, 32), torch.randint(0, 100, (2, 16))
    relu_fallback = {"min_block_size": 1, "torch_executed_ops": {torch.ops.aten.relu.default}}
    return [
        ("resnet", TinyResNet().eval(), (torch.randn(2, 3, 16, 16),), {}),
        ("mobilenet", SmallMobileNet().eval(), (image,), {}),
        ("vit", SmallEncoder(patches=True).eval(), (image,), {}),
        ("bert", SmallEncoder(patches=False).eval(), (tokens,), {}),
        ("gpt2", SmallEncoder(patches=False, causal=True).eval(), (tokens,), {}),
        ("lstm", LstmClassifier().eval(), (tokens,), {}),
        ("relu_fallback", ConvBnRelu().eval(), (torch.randn(2, 3, 16, 16),), relu_fallback),
        ("norm_mlp", NormMlp().eval(), (torch.randn(2, 8),), {}),
        ("fp16_overflow", Fp16Overflow().eval(), (torch.randn(8, 16),), {}),
        ("long_sum", LongSum().eval(), (torch.randn(8, 16),), {}),
        ("large_mean_norm", LargeMeanNorm().eval(), (torch.randn(8, 16),), {}),
    ]


class Garbage(nn.Module):
    """An engine (everything but relu) that computes garbage of one kind; relu falls back."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(x)
        if self.kind == "zeros":
            h = h * 0.0
        elif self.kind == "nan":
            h = (h - h) / (h - h)
        elif self.kind == "constant":
            h = h * 0.0 + 0.25
        elif self.kind == "rows":
            h = h.mean(0, keepdim=True).expand_as(h) * 1.0
        return torch.relu(h) + 1.0
