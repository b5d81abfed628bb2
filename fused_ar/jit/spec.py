"""What to build: `KernelSpec`, a frozen, hashable value, and the enums it is made of.

A spec names one specialization (op, dtype, pack bytes, ngpus, block size, arch). It knows nothing of
source text, compilers or caches; `render` turns it into source.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any, Mapping, Union


class DType(str, Enum):
    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"

    @property
    def itemsize(self) -> int:
        return 4 if self is DType.FP32 else 2

    @property
    def render_id(self) -> str:
        """The FA_DTYPE value kernels_src/fa_types.h expects."""
        return f"FA_DTYPE_{self.name}"

    @property
    def code(self) -> int:
        """The number kernels publish for this dtype in a call descriptor (FA_DTYPE_CODE)."""
        return list(DType).index(self)

    @property
    def torch_name(self) -> str:
        return {DType.FP32: "float32", DType.FP16: "float16", DType.BF16: "bfloat16"}[self]

    @classmethod
    def parse(cls, value: Any) -> "DType":
        """Accepts a DType, its short name, a torch dtype or its name ('bfloat16', 'half', ...)."""
        if isinstance(value, DType):
            return value
        name = str(value).removeprefix("torch.").lower()
        aliases = {"bf16": cls.BF16, "bfloat16": cls.BF16, "fp16": cls.FP16, "float16": cls.FP16,
                   "half": cls.FP16, "fp32": cls.FP32, "float32": cls.FP32, "float": cls.FP32}
        if name not in aliases:
            raise ValueError(f"unsupported dtype {value!r}: fused_ar takes bf16, fp16 or fp32")
        return aliases[name]


class WeightKind(str, Enum):
    """What the RMSNorm weight is: x's dtype, fp32 with a 16-bit x (Gemma checkpoints), or absent (ones)."""

    SAME = "same"
    FP32 = "fp32"
    NONE = "none"

    @property
    def render_id(self) -> str:
        return f"FA_WEIGHT_{self.name}"


class Quant(str, Enum):
    """The output of an RMSNorm op: T, or FP8 with a given scale, a scale per row, or a scale per group:
    fp32 scales, power-of-two scales as fp32 (GROUP_POW2), or those as UE8M0 bytes four to an int32
    (GROUP_UE8M0); or FP4 (E2M1 values two a byte): NVFP4 with its E4M3 block scales row-major or in the
    GEMMs' swizzled tiles, MXFP4 with its UE8M0 block scales (OCP's rounding of the scale, AMD aiter's RCEIL
    or AMD Quark's EVEN)."""

    NONE = "none"
    STATIC = "static"
    TOKEN = "token"
    GROUP = "group"
    GROUP_POW2 = "group_pow2"
    GROUP_UE8M0 = "group_ue8m0"
    NVFP4 = "nvfp4"
    NVFP4_SWIZZLED = "nvfp4_swizzled"
    MXFP4 = "mxfp4"
    MXFP4_RCEIL = "mxfp4_rceil"
    MXFP4_EVEN = "mxfp4_even"

    @property
    def per_group(self) -> bool:
        return self in (Quant.GROUP, Quant.GROUP_POW2, Quant.GROUP_UE8M0)

    @property
    def fp4(self) -> bool:
        return self in (Quant.NVFP4, Quant.NVFP4_SWIZZLED) or self.mxfp4

    @property
    def mxfp4(self) -> bool:
        return self in (Quant.MXFP4, Quant.MXFP4_RCEIL, Quant.MXFP4_EVEN)

    @property
    def mxfp4_rounding(self) -> int:
        """FA_MXFP4_ROUNDING (kernels_src/fa_fp4.h): 0 OCP, 1 RCEIL, 2 EVEN; 0 for the other kinds."""
        return {Quant.MXFP4_RCEIL: 1, Quant.MXFP4_EVEN: 2}.get(self, 0)

    @property
    def converts_e4m3(self) -> bool:
        """Whether the kernel converts to E4M3: FP8 values, or NVFP4's block scales (MXFP4's are exponents)."""
        return self is not Quant.NONE and not self.mxfp4

    @property
    def fp4_block(self) -> int:
        """Values per FP4 block scale: 16 (NVFP4), 32 (MXFP4); 0 for the other kinds."""
        return 32 if self.mxfp4 else (16 if self.fp4 else 0)

    @property
    def render_id(self) -> str:
        if self.per_group:
            return "FA_QUANT_GROUP"
        if self.mxfp4:
            return "FA_QUANT_MXFP4"
        return "FA_QUANT_NVFP4" if self is Quant.NVFP4_SWIZZLED else f"FA_QUANT_{self.name}"


class Fp8Format(str, Enum):
    """FP8 E4M3 as OCP defines it (NVIDIA, gfx950) or as gfx942 computes it (finite, bias 8, no -0)."""

    E4M3FN = "e4m3fn"
    E4M3FNUZ = "e4m3fnuz"

    @property
    def max(self) -> float:
        return 448.0 if self is Fp8Format.E4M3FN else 240.0

    @property
    def torch_name(self) -> str:
        return f"float8_{self.value}"


def sm_version(arch: str) -> int:
    """An NVIDIA arch's number (sm_90a -> 90), 0 for any other arch."""
    return int(arch.removeprefix("sm_").rstrip("af")) if platform_of_arch(arch) is Platform.CUDA else 0


def fp8_in_hardware(arch: str, fmt: Fp8Format) -> bool:
    """Whether `arch` converts to `fmt` with an instruction (sm_89+ E4M3FN: cvt.rn.satfinite; gfx942 E4M3FNUZ
    and gfx950 E4M3FN: v_cvt_pk_fp8_f32); elsewhere the kernels round in software to the same bits."""
    if platform_of_arch(arch) is Platform.CUDA:
        return fmt is Fp8Format.E4M3FN and sm_version(arch) >= 89
    target = arch.split(":")[0]
    return (target, fmt) in (("gfx942", Fp8Format.E4M3FNUZ), ("gfx950", Fp8Format.E4M3FN))


def native_fp8(arch: str) -> Fp8Format:
    """The FP8 format a target's hardware computes: E4M3FNUZ on gfx942 (MI300), E4M3FN elsewhere."""
    return Fp8Format.E4M3FNUZ if arch.split(":")[0] in ("gfx940", "gfx941", "gfx942") else Fp8Format.E4M3FN


class Platform(str, Enum):
    CUDA = "cuda"
    HIP = "hip"


class Op(str, Enum):
    ADD_RMSNORM = "add_rmsnorm"
    ALLREDUCE_RMSNORM_1STAGE = "allreduce_rmsnorm_1stage"
    ALLREDUCE_RMSNORM_2STAGE = "allreduce_rmsnorm_2stage"
    ALLREDUCE_1STAGE = "allreduce_1stage"
    ALLREDUCE_2STAGE = "allreduce_2stage"
    REDUCE_SCATTER_RMSNORM = "reduce_scatter_rmsnorm"  # sequence parallelism: the fused op on this rank's rows
    ALL_GATHER = "all_gather"

    @property
    def code(self) -> int:
        """The number kernels publish for this op in a call descriptor (FA_OP_CODE)."""
        return list(Op).index(self)


# Architectures: NVIDIA `sm_XX` (a CUBIN needs a real sm, not compute_XX); AMD `gfxNNN` with optional
# target features as the driver reports them (`gfx942:sramecc+:xnack-`).
# Matched whole (fullmatch: `$` would accept a trailing newline) and in ASCII only (`\d` takes any digit).
_CUDA_ARCH = re.compile(r"sm_[0-9]{2,3}[af]?")
_HIP_ARCH = re.compile(r"gfx[0-9a-f]{3,4}(:[a-z0-9_]+[+-])*")

SUPPORTED_NGPUS = (1, 2, 3, 4, 5, 6, 7, 8)  # 1: the local add_rmsnorm; the rest: group sizes
BLOCK_SIZES = (64, 128, 256, 512, 1024)
# add_rmsnorm also takes every whole number of 64 threads up to 512 (whole waves on both vendors): a short row
# gets the fewest threads that hold it two packs a thread (fused_ar/jit/kernels.py, add_rmsnorm_block).
ADD_RMSNORM_BLOCKS = tuple(sorted(set(BLOCK_SIZES) | set(range(64, 512 + 1, 64))))
# Bytes per thread access; 2 (one 16-bit element) serves add_rmsnorm rows whose starts are not aligned.
PACK_SIZES = (2, 4, 8, 16)
DEFAULT_PACK = 16
RMSNORM_OPS = ("add_rmsnorm", "allreduce_rmsnorm_1stage", "allreduce_rmsnorm_2stage", "reduce_scatter_rmsnorm")


def platform_of_arch(arch: str) -> Platform:
    if not isinstance(arch, str):
        raise ValueError(f"arch must be a string such as sm_90 or gfx942, not {type(arch).__name__}")
    if _CUDA_ARCH.fullmatch(arch):
        return Platform.CUDA
    if _HIP_ARCH.fullmatch(arch):
        return Platform.HIP
    raise ValueError(f"unknown arch {arch!r}: expected sm_XX (NVIDIA) or gfxNNN[:feature+|-...] (AMD)")


@dataclass(frozen=True)
class KernelSpec:
    """What to build: a frozen, hashable value; everything that shapes a kernel's bytes besides the source."""

    op: Op
    dtype: DType
    arch: str
    pack: int = DEFAULT_PACK
    ngpus: int = 1
    block: int = 256
    weight: WeightKind = WeightKind.SAME  # RMSNorm ops only
    residual: bool = True  # RMSNorm ops only: False adds no residual (residual_out is the row's values)
    inplace: bool = False  # RMSNorm ops only: outputs may be their inputs (no __restrict__ between them)
    quant: Quant = Quant.NONE  # RMSNorm ops only: out in T or FP8
    fp8: Fp8Format = Fp8Format.E4M3FN  # with quant: the FP8 format
    short_rows: bool = False  # add_rmsnorm with T output only: rows of at most 2 packs a thread (kernels.py)

    def __post_init__(self) -> None:
        object.__setattr__(self, "op", Op(self.op))
        object.__setattr__(self, "dtype", DType.parse(self.dtype))
        object.__setattr__(self, "weight", WeightKind(self.weight))
        object.__setattr__(self, "quant", Quant(self.quant))
        object.__setattr__(self, "fp8", Fp8Format(self.fp8))
        if self.quant is Quant.NONE or self.quant.fp4:
            object.__setattr__(self, "fp8", Fp8Format.E4M3FN)  # no FP8 output (NVFP4's scales are E4M3FN): one key
        if self.weight is WeightKind.FP32 and self.dtype is DType.FP32:
            object.__setattr__(self, "weight", WeightKind.SAME)  # one kernel, one key
        platform_of_arch(self.arch)
        if self.pack not in PACK_SIZES or self.pack < self.dtype.itemsize or self.pack % self.dtype.itemsize:
            raise ValueError(f"pack={self.pack} bytes: must be one of {PACK_SIZES} and hold whole {self.dtype.value}s")
        if self.op.value not in RMSNORM_OPS and (self.weight is not WeightKind.SAME or not self.residual
                                                 or self.inplace or self.quant is not Quant.NONE):
            raise ValueError(f"{self.op.value} has no weight, residual, in-place or FP8 variants")
        if not all(isinstance(v, bool) for v in (self.residual, self.inplace, self.short_rows)):
            raise ValueError("residual, inplace and short_rows are booleans")
        if self.quant.fp4 and self.pack != DEFAULT_PACK:
            raise ValueError(f"FP4 output takes {DEFAULT_PACK}-byte packs (whole bytes of codes), not pack={self.pack}")
        if self.short_rows and self.op is not Op.ADD_RMSNORM:
            raise ValueError(f"short_rows is a variant of add_rmsnorm, not of {self.op.value}")
        if self.ngpus not in SUPPORTED_NGPUS:
            raise ValueError(f"ngpus={self.ngpus}: must be one of {SUPPORTED_NGPUS}")
        blocks = ADD_RMSNORM_BLOCKS if self.op is Op.ADD_RMSNORM else BLOCK_SIZES
        if self.block not in blocks:
            raise ValueError(f"block={self.block}: {self.op.value} takes one of {blocks}")

    @property
    def platform(self) -> Platform:
        return platform_of_arch(self.arch)

    @property
    def pack_elems(self) -> int:
        return self.pack // self.dtype.itemsize

    @property
    def kernel_name(self) -> str:
        """The kernel's symbol: unique per spec, readable in profiler traces."""
        variant = ("" if self.weight is WeightKind.SAME else f"_w{self.weight.value}") + \
            ("" if self.residual else "_nores") + ("_inplace" if self.inplace else "") + \
            ("" if self.quant is Quant.NONE else f"_q{self.quant.value}_{self.fp8.value}") + \
            ("_short" if self.short_rows else "")
        return f"fa_{self.op.value}_{self.dtype.value}_p{self.pack}_g{self.ngpus}_b{self.block}{variant}"

    def to_dict(self) -> dict[str, Union[str, int]]:
        d = asdict(self)
        d["op"], d["dtype"], d["weight"] = self.op.value, self.dtype.value, self.weight.value
        d["quant"], d["fp8"] = self.quant.value, self.fp8.value
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "KernelSpec":
        return cls(**d)

    def __str__(self) -> str:
        defaults = {"weight": "same", "residual": True, "inplace": False, "quant": "none", "fp8": "e4m3fn",
                    "short_rows": False}
        variant = "".join(f", {k}={v}" for k, v in (("weight", self.weight.value), ("residual", self.residual),
                                                   ("inplace", self.inplace), ("quant", self.quant.value),
                                                   ("fp8", self.fp8.value), ("short_rows", self.short_rows))
                          if v != defaults[k])
        return (f"KernelSpec({self.op.value}, {self.dtype.value}, {self.arch}, pack={self.pack}, "
                f"ngpus={self.ngpus}, block={self.block}{variant})")
