"""A real sparse-convolution backbone for the example and the benchmarks: a spconv UNet (3 levels by default).

The one home of the spconv UNet (``SpconvUNet``), of the voxelization it runs on (``voxelize_batch``) and of the CPU stream patch (``patch_cpu_stream``); ``examples/train_ddp.py
--backbone spconv``, ``benchmarks/gpu_cost.py`` and ``benchmarks/ddp_bench.py`` all use it from here.

spconv is NOT a lidarshard dependency (the trainer side never imports it): ``pip install spconv`` for
the CPU build, ``spconv-cu12x`` on a CUDA host; ``make test`` installs the CPU build when it can.
``require_spconv`` turns its absence into one line that says so.

    from sparse_unet import SparseSegNet   # examples/ on sys.path
    net = SparseSegNet(in_dims=5, classes=4, voxel_size=0.1)
    logits = net(points, batch)            # (N, C) float32, (N,) int64 -> (N, classes)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = [
    "SPCONV_MISSING",
    "require_spconv",
    "patch_cpu_stream",
    "voxelize_batch",
    "SMALL",
    "MINK",
    "SpconvUNet",
    "SparseSegNet",
]

#: The one-line error of ``require_spconv``.
SPCONV_MISSING = (
    "--backbone spconv needs spconv, which is not installed: pip install spconv "
    "(CPU build; spconv-cu12x on a CUDA host), or use --backbone mlp"
)


def require_spconv() -> None:
    """Raise ``ImportError(SPCONV_MISSING)`` unless ``spconv.pytorch`` imports."""
    try:
        import spconv.pytorch  # noqa: F401
    except ImportError as e:
        raise ImportError(SPCONV_MISSING) from e


def patch_cpu_stream() -> None:
    """On a CPU-only torch, make spconv pass stream 0 for its CPU ops.

    spconv 2.x's CPU build calls ``torch.cuda.current_stream()`` even for CPU tensors, which a CPU-only
    torch refuses; CPU kernels ignore the stream. A no-op when CUDA is available.
    """
    if torch.cuda.is_available():
        return
    from spconv.pytorch import cppcore, ops
    from spconv.pytorch import hash as sphash

    for module in (cppcore, ops, sphash):
        module.get_current_stream = lambda: 0


def voxelize_batch(
    points: torch.Tensor, batch: torch.Tensor, voxel: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Occupied voxels of every sample of a batch.

    Args:
        points: (N, C >= 4) float x, y, z (m), intensity, ...; NaN rows count as the origin.
        batch: (N,) int64 sample index of each point, 0..B-1.
        voxel: voxel edge, m.

    Returns:
        ((V, 4) int32 [sample, x, y, z] voxel coords, each sample's shifted to start at 0; (V, 4) float
        mean x, y, z, intensity of each voxel's points; (N,) int64 voxel of each point).
    """
    xyzi = torch.nan_to_num(points[:, :4])
    c = torch.floor(xyzi[:, :3] / voxel).long()
    lows = torch.full((int(batch.max()) + 1 if batch.numel() else 0, 3), 0, dtype=torch.long)
    lows = lows.scatter_reduce(0, batch[:, None].expand_as(c), c, reduce="amin", include_self=False)
    keyed = torch.cat([batch[:, None], c - lows[batch]], dim=1)
    uniq, inverse = torch.unique(keyed, dim=0, return_inverse=True)
    feats = torch.zeros(len(uniq), 4, dtype=xyzi.dtype).index_add_(0, inverse, xyzi)
    feats /= torch.bincount(inverse, minlength=len(uniq)).clamp_min(1)[:, None]
    return uniq.int(), feats, inverse


#: The widths of the UNet's levels: ``SMALL`` (this example's, 3 levels) and ``MINK`` (MinkUNet-sized: 4 levels,
#: 32 to 256 channels, as MinkUNet and Cylinder3D-class segmentation backbones at 0.05 m).
SMALL = (16, 32, 64)
MINK = (32, 64, 128, 256)


def SpconvUNet(classes: int = 16, widths: tuple[int, ...] = SMALL) -> nn.Module:  # noqa: N802 - builds a class lazily
    """A spconv UNet of ``len(widths)`` levels: SubM blocks, stride-2 SparseConv down, SparseInverseConv up, skips.

    The module maps ((V, 4) int32 [sample, x, y, z] coords, (V, 4) float voxel features) to (V, classes)
    voxel logits, in the order of the coords. Raises ``ImportError(SPCONV_MISSING)`` without spconv.
    """
    require_spconv()
    import spconv.pytorch as sp

    patch_cpu_stream()

    def block(cin: int, cout: int, key: str) -> Any:
        return sp.SparseSequential(
            sp.SubMConv3d(cin, cout, 3, indice_key=key, bias=False),
            nn.BatchNorm1d(cout),
            nn.ReLU(),
            sp.SubMConv3d(cout, cout, 3, indice_key=key, bias=False),
            nn.BatchNorm1d(cout),
            nn.ReLU(),
        )

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            w = widths
            self.enc = nn.ModuleList(
                [block(4, w[0], "s0")] + [block(w[i], w[i], f"s{i}") for i in range(1, len(w))]
            )
            self.down = nn.ModuleList(
                sp.SparseConv3d(w[i - 1], w[i], 3, stride=2, indice_key=f"d{i}", bias=False)
                for i in range(1, len(w))
            )
            self.up = nn.ModuleList(
                sp.SparseInverseConv3d(w[i], w[i - 1], 3, indice_key=f"d{i}", bias=False)
                for i in range(1, len(w))
            )
            self.dec = nn.ModuleList(block(2 * w[i], w[i], f"s{i}") for i in range(len(w) - 1))
            self.head = nn.Linear(w[0], classes)

        def forward(self, coords: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
            low = 2 ** len(
                widths
            )  # each level halves the grid: a flat sample still keeps a cell at the bottom
            shape = [max(int(v), low) for v in (coords[:, 1:].max(0).values + 1).tolist()]
            samples = int(coords[:, 0].max()) + 1
            x = self.enc[0](sp.SparseConvTensor(feats / 50.0, coords, shape, samples))
            skips = [x]
            for down, enc in zip(self.down, self.enc[1:], strict=True):
                x = enc(down(x))
                skips.append(x)
            for i in reversed(range(len(self.up))):
                x = self.up[i](x)
                x = self.dec[i](x.replace_feature(torch.cat([x.features, skips[i].features], 1)))
            return self.head(x.features)

    return Net()


class SparseSegNet(nn.Module):
    """Per-point segmentation on the spconv UNet: (N, C) points, (N,) sample index -> (N, classes).

    Voxelizes each sample (keyframe + sweeps as loaded) at ``voxel_size`` m, runs ``SpconvUNet`` on
    the voxels and gives each point its voxel's logits: the interface of ``train_ddp.SegNet``, so the
    loss, the labels and the evaluation are the same for both backbones.
    """

    def __init__(self, classes: int, voxel_size: float) -> None:
        super().__init__()
        self.voxel_size = voxel_size
        self.unet = SpconvUNet(classes)

    def forward(self, points: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        """points (N, C >= 4) float32, batch (N,) int64 -> (N, classes) logits."""
        coords, feats, inverse = voxelize_batch(points, batch, self.voxel_size)
        return self.unet(coords, feats)[inverse]
