"""How a torch tensor looks to MPI: datatypes, reduction operators, and staging.

Data movement is zero-copy for contiguous CPU tensors: MPI gets the tensor's own memory as a raw buffer
(``MPI.buffer.fromaddress``), with an MPI datatype of the same element size. Three dtypes have no MPI
type of their own:

* ``float16`` and ``bfloat16`` move as ``MPI_INT16_T``; their reductions are user-defined MPI
  operators whose kernels are torch's own (``add``, ``mul``, ``minimum``, ``maximum`` on views of MPI's
  buffers). Partial results are rounded to the 16-bit type at every step, as gloo's and NCCL's 16-bit
  reductions do; sums of many values therefore differ from a float32 reference by a few ulps.
* ``bool`` moves as ``MPI_UINT8_T`` (torch stores 0 or 1 in a byte) and reduces with bitwise operators,
  which on 0/1 are the logical ones: SUM and MAX are OR, PRODUCT and MIN are AND.

AVG is SUM followed by a division by the group size, for floating-point dtypes only. Integer and bool
AVG is refused, as gloo refuses it: a silent floor would hide a bug (sum and divide explicitly).
PREMUL_SUM is NCCL's and is refused. Bitwise ops need integer or bool tensors.

An ``Operand`` is a tensor ready for MPI. Non-contiguous tensors, and CUDA tensors when the MPI library
is not CUDA-aware, are staged: copied into a contiguous host tensor, and (for outputs) copied back when
the operation completes. CUDA tensors with a CUDA-aware MPI go to MPI directly, after the current
stream is synchronized so that MPI reads finished data.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from mpi4py import MPI

RedOpType = dist.ReduceOp.RedOpType

#: the MPI datatype each supported torch dtype moves as (same element size)
MOVE_TYPE: dict[torch.dtype, MPI.Datatype] = {
    torch.float32: MPI.FLOAT, torch.float64: MPI.DOUBLE,
    torch.float16: MPI.INT16_T, torch.bfloat16: MPI.INT16_T,
    torch.int8: MPI.INT8_T, torch.int16: MPI.INT16_T, torch.int32: MPI.INT32_T,
    torch.int64: MPI.INT64_T, torch.uint8: MPI.UINT8_T, torch.bool: MPI.UINT8_T,
}
SUPPORTED = ", ".join(str(d).removeprefix("torch.") for d in MOVE_TYPE)
_HALF = (torch.float16, torch.bfloat16)
_FLOAT = (torch.float32, torch.float64)

_NATIVE = {RedOpType.SUM: MPI.SUM, RedOpType.AVG: MPI.SUM, RedOpType.PRODUCT: MPI.PROD,
           RedOpType.MIN: MPI.MIN, RedOpType.MAX: MPI.MAX, RedOpType.BAND: MPI.BAND,
           RedOpType.BOR: MPI.BOR, RedOpType.BXOR: MPI.BXOR}
_BOOL = {RedOpType.SUM: MPI.BOR, RedOpType.MAX: MPI.BOR, RedOpType.PRODUCT: MPI.BAND,
         RedOpType.MIN: MPI.BAND, RedOpType.BAND: MPI.BAND, RedOpType.BOR: MPI.BOR,
         RedOpType.BXOR: MPI.BXOR}
_KERNELS = {RedOpType.SUM: torch.add, RedOpType.AVG: torch.add, RedOpType.PRODUCT: torch.mul,
            RedOpType.MIN: torch.minimum, RedOpType.MAX: torch.maximum}
_BITWISE = (RedOpType.BAND, RedOpType.BOR, RedOpType.BXOR)


class Reduction:
    """An MPI operator for one (torch op, dtype) pair, whether to divide afterwards (AVG), whether
    the operator runs Python (so reads host memory), and the torch kernel that does the same
    (``kernel(a, b, out=c)``, for the shared-memory path) or None."""

    __slots__ = ("op", "average", "python", "kernel")

    def __init__(self, op: MPI.Op, average: bool, python: bool, kernel=None) -> None:
        self.op, self.average, self.python, self.kernel = op, average, python, kernel


# torch's ReduceOp hashes to its kind (``RedOpType``'s value), and so does a RedOpType; comparing
# two ReduceOps takes 0.84 us (pybind's overloaded ``__eq__``), reading one's kind (``op.op``) 0.4,
# its hash 0.06. torch makes a new ReduceOp for every call's options, so a dict keyed by the op
# itself paid the comparison on every call. Keyed by the hash, where it is the kind:
_KINDS = [k for k in RedOpType.__members__.values() if k != RedOpType.PREMUL_SUM]
HASH_IS_KIND = all(hash(dist.ReduceOp(k)) == int(k) == hash(k) for k in _KINDS)


def _kind(op: dist.ReduceOp) -> int:
    return int(op if isinstance(op, RedOpType) else op.op)


#: ``op``'s kind as an int, for a ReduceOp or a RedOpType: ``RedOpType(kind(op))`` is the kind
kind = hash if HASH_IS_KIND else _kind


# dtype -> kind -> Reduction, on every call's path
_REDUCTIONS: dict[torch.dtype, dict[int, Reduction]] = {}
_NONE: dict = {}


def check_dtype(dtype: torch.dtype, what: str) -> None:
    if dtype not in MOVE_TYPE:
        raise TypeError(f"mpi backend: {what} got a {dtype} tensor; supported dtypes: {SUPPORTED}")


def reduction(op: dist.ReduceOp, dtype: torch.dtype) -> Reduction:
    """The MPI operator for ``op`` on ``dtype`` tensors (cached), or a ValueError that says why not."""
    k = kind(op)
    found = _REDUCTIONS.get(dtype, _NONE).get(k)
    if found is None:  # PREMUL_SUM, whose ReduceOp carries a factor too, is refused, never kept
        found = _REDUCTIONS.setdefault(dtype, {})[k] = _make_reduction(RedOpType(k), dtype)
    return found


def _make_reduction(kind: RedOpType, dtype: torch.dtype) -> Reduction:
    check_dtype(dtype, f"a {kind.name} reduction")
    name = f"ReduceOp.{kind.name}"
    if kind not in _NATIVE:
        raise ValueError(f"mpi backend: {name} is not supported (PREMUL_SUM is NCCL's); "
                         "use SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR or BXOR")
    floating = dtype in _FLOAT or dtype in _HALF
    if kind in _BITWISE and floating:
        raise ValueError(f"mpi backend: {name} needs integer or bool tensors, got {dtype}")
    if kind == RedOpType.AVG and not floating:
        raise ValueError(f"mpi backend: {name} on {dtype} tensors is refused (as gloo refuses it): "
                         "an integer average would have to round; use SUM and divide explicitly")
    kernel = _KERNELS.get(kind)  # on bool tensors add is OR and mul is AND, as _BOOL has it
    if dtype == torch.bool:
        return Reduction(_BOOL[kind], False, False, kernel)
    if dtype in _HALF:
        return Reduction(_torch_operator(kernel, dtype), kind == RedOpType.AVG, True, kernel)
    return Reduction(_NATIVE[kind], kind == RedOpType.AVG, False, kernel)


def _torch_operator(kernel, dtype: torch.dtype) -> MPI.Op:
    """A commutative MPI operator that combines 16-bit floats with a torch kernel, in place."""

    def combine(inbuf, inoutbuf, datatype) -> None:
        if len(inoutbuf):  # MPI may call with empty segments; frombuffer refuses those
            acc = torch.frombuffer(inoutbuf, dtype=dtype)
            kernel(acc, torch.frombuffer(inbuf, dtype=dtype), out=acc)

    return MPI.Op.Create(combine, commute=True)


def spec(tensor: torch.Tensor, count: int | None = None) -> list:
    """``[memory, count, datatype]`` for a contiguous tensor MPI may address directly.

    ``count`` is the elements per rank where the buffer holds one block per rank (Allgather's
    receive buffer, Reduce_scatter_block's send buffer): that is how mpi4py reads it.
    """
    return [MPI.buffer.fromaddress(tensor.data_ptr(), tensor.numel() * tensor.element_size()),
            tensor.numel() if count is None else count, MOVE_TYPE[tensor.dtype]]


def vspec(tensor: torch.Tensor, counts: list[int]) -> list:
    """``[memory, counts, displacements, datatype]`` for the v-variants (Gatherv, Alltoallv...)."""
    displs, at = [], 0
    for c in counts:
        displs.append(at)
        at += c
    return [MPI.buffer.fromaddress(tensor.data_ptr(), tensor.numel() * tensor.element_size()),
            counts, displs, MOVE_TYPE[tensor.dtype]]


class Operand:
    """A tensor ready for MPI: ``local`` is contiguous memory MPI may use; ``finish()`` puts results back.

    ``write`` says whether MPI writes into it (outputs are copied back after staging). ``direct_cuda``
    says whether CUDA memory may go to MPI as is (a CUDA-aware MPI, and no Python reduction kernel that
    would have to read it on the host).
    """

    __slots__ = ("tensor", "local", "write")

    def __init__(self, tensor: torch.Tensor, write: bool, direct_cuda: bool = False) -> None:
        self.tensor, self.write = tensor, write
        if tensor.is_cpu:
            self.local = tensor if tensor.is_contiguous() else tensor.contiguous()
        elif direct_cuda and tensor.is_contiguous():
            torch.cuda.current_stream(tensor.device).synchronize()
            self.local = tensor
        else:  # staged through host memory (a device-to-host copy synchronizes the stream)
            self.local = tensor.detach().to("cpu", memory_format=torch.contiguous_format)

    @property
    def staged(self) -> bool:
        return self.local is not self.tensor

    def spec(self, count: int | None = None) -> list:
        return spec(self.local, count)

    def finish(self) -> None:
        if self.write and self.local is not self.tensor:
            self.tensor.copy_(self.local)


def scratch(numel: int, like: torch.Tensor, direct_cuda: bool) -> torch.Tensor:
    """A contiguous buffer of ``numel`` elements where MPI can work for tensors like ``like``."""
    device = like.device if (like.device.type == "cpu" or direct_cuda) else torch.device("cpu")
    return torch.empty(numel, dtype=like.dtype, device=device)
