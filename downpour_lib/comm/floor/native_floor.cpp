// A torch.distributed backend in C++ whose collectives are MPI's blocking calls and nothing else:
// no liveness gate, no timeout, no watchdog, no staging, no profiler events, no async work. It is
// not for training (a rank that goes silent hangs it forever); `downpour bench collectives
// --breakdown` times it beside the `mpi` backend to show what a native backend gains over ours,
// and what torch.distributed's dispatch costs even then (comm/floor/native_floor.py builds and
// loads it).
// Made `gated`, each collective first waits for every rank at the `mpi` backend's liveness gate,
// in C++: MPI_Ibarrier, tested spinning for SPIN_S, then with naps growing to NAP_S (waits.py's,
// given by native_floor.py), given up at a deadline (liveness.gate and wait_request, less the
// watchdog): what the one guarantee that costs each blocking call something would cost a native
// backend.
// torch's pybind11 and its casters, not <torch/extension.h>: that adds all of libtorch's C++ API
// (torch/all.h) to a build that uses none of it (40 s of one core to compile here, against 25)
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <mpi.h>
#include <mpi4py/mpi4py.h>

#include <algorithm>
#include <chrono>
#include <thread>

namespace {

MPI_Datatype mpi_type(const at::Tensor& t) {
  TORCH_CHECK(t.is_cpu() && t.is_contiguous(), "native floor: contiguous CPU tensors only");
  switch (t.scalar_type()) {
    case at::kFloat: return MPI_FLOAT;
    case at::kDouble: return MPI_DOUBLE;
    case at::kInt: return MPI_INT32_T;
    case at::kLong: return MPI_INT64_T;
    default: TORCH_CHECK(false, "native floor: float32, float64, int32 or int64, not ", t.scalar_type());
  }
}

MPI_Op mpi_op(const c10d::ReduceOp& op) {
  TORCH_CHECK(op == c10d::ReduceOp::SUM, "native floor: SUM only");
  return MPI_SUM;
}

void check(int rc, const char* what) {
  TORCH_CHECK(rc == MPI_SUCCESS, "native floor: ", what, " returned MPI error ", rc);
}

// Complete when made: every call below has returned from MPI before its work exists.
class DoneWork : public c10d::Work {
 public:
  explicit DoneWork(std::vector<at::Tensor> out)
      : c10d::Work(-1, c10d::OpType::UNKNOWN), out_(std::move(out)) {}
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds) override { return true; }
  std::vector<at::Tensor> result() override { return out_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    auto future = c10::make_intrusive<c10::ivalue::Future>(
        c10::ListType::create(c10::TensorType::get()));
    future->markCompleted(c10::IValue(out_));
    return future;
  }

 private:
  std::vector<at::Tensor> out_;
};

class NativeFloor : public c10d::Backend {
 public:
  NativeFloor(MPI_Comm comm, int rank, int size, bool gated, double timeout_s, double spin_s,
              double nap_s)
      : c10d::Backend(rank, size), comm_(comm), gated_(gated), timeout_(timeout_s),
        spin_(spin_s), nap_(nap_s) {}
  ~NativeFloor() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);  // torch may drop it at exit, after mpi4py's finalize
  }
  const std::string getBackendName() const override {
    return gated_ ? "downpour_native_gated" : "downpour_native_floor";
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& ts,
                                           const c10d::AllreduceOptions& opts) override {
    gate();
    at::Tensor& t = one(ts);
    check(MPI_Allreduce(MPI_IN_PLACE, t.data_ptr(), t.numel(), mpi_type(t), mpi_op(opts.reduceOp),
                        comm_), "MPI_Allreduce");
    return c10::make_intrusive<DoneWork>(ts);
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& ts,
                                           const c10d::BroadcastOptions& opts) override {
    gate();
    at::Tensor& t = one(ts);
    check(MPI_Bcast(t.data_ptr(), t.numel(), mpi_type(t), opts.rootRank, comm_), "MPI_Bcast");
    return c10::make_intrusive<DoneWork>(ts);
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& ts,
                                        const c10d::ReduceOptions& opts) override {
    gate();
    at::Tensor& t = one(ts);
    void* send = getRank() == opts.rootRank ? MPI_IN_PLACE : t.data_ptr();
    check(MPI_Reduce(send, t.data_ptr(), t.numel(), mpi_type(t), mpi_op(opts.reduceOp),
                     opts.rootRank, comm_), "MPI_Reduce");
    return c10::make_intrusive<DoneWork>(ts);
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& out, at::Tensor& in,
                                                 const c10d::AllgatherOptions&) override {
    gate();
    TORCH_CHECK(out.numel() == in.numel() * getSize(), "native floor: output is not size x input");
    check(MPI_Allgather(in.data_ptr(), in.numel(), mpi_type(in), out.data_ptr(), in.numel(),
                        mpi_type(out), comm_), "MPI_Allgather");
    return c10::make_intrusive<DoneWork>(std::vector<at::Tensor>{out});
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& out, at::Tensor& in,
                                                      const c10d::ReduceScatterOptions& opts) override {
    gate();
    TORCH_CHECK(in.numel() == out.numel() * getSize(), "native floor: input is not size x output");
    check(MPI_Reduce_scatter_block(in.data_ptr(), out.data_ptr(), out.numel(), mpi_type(in),
                                   mpi_op(opts.reduceOp), comm_), "MPI_Reduce_scatter_block");
    return c10::make_intrusive<DoneWork>(std::vector<at::Tensor>{out});
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
    check(MPI_Barrier(comm_), "MPI_Barrier");
    return c10::make_intrusive<DoneWork>(std::vector<at::Tensor>{});
  }

 private:
  // Every rank has reached this collective once it returns; an error past the deadline.
  void gate() {
    if (!gated_ || getSize() == 1) return;
    MPI_Request request;
    check(MPI_Ibarrier(comm_, &request), "MPI_Ibarrier");
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    int done = 0;
    while (true) {
      check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done) return;
      const std::chrono::duration<double> waited = clock::now() - start;
      if (waited.count() >= timeout_) break;
      if (waited > spin_) {  // as wait_request naps: a 32nd of the wait so far, SPIN_S to NAP_S
        std::this_thread::sleep_for(std::clamp(waited / 32, spin_, nap_));
      }
    }
    TORCH_CHECK(false, "native floor: a rank did not reach the gate in ", timeout_, " s");
  }

  static at::Tensor& one(std::vector<at::Tensor>& ts) {
    TORCH_CHECK(ts.size() == 1, "native floor: one tensor per call, got ", ts.size());
    return ts[0];
  }

  MPI_Comm comm_;
  const bool gated_;
  const double timeout_;
  const std::chrono::duration<double> spin_, nap_;  // waits.py's SPIN_S and NAP_S, given
};

// A backend on a duplicate of `comm` (an mpi4py communicator), which it frees when torch drops it;
// `gated`: behind the gate, whose wait spins `spin_s`, naps up to `nap_s` and ends in an error after
// `timeout_s`.
c10::intrusive_ptr<c10d::Backend> create(py::object comm, bool gated, double timeout_s,
                                         double spin_s, double nap_s) {
  MPI_Comm* handle = PyMPIComm_Get(comm.ptr());
  if (handle == nullptr) throw py::error_already_set();
  MPI_Comm dup;
  check(MPI_Comm_dup(*handle, &dup), "MPI_Comm_dup");
  int rank = 0, size = 0;
  MPI_Comm_rank(dup, &rank);
  MPI_Comm_size(dup, &size);
  return c10::make_intrusive<NativeFloor>(dup, rank, size, gated, timeout_s, spin_s, nap_s);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  if (import_mpi4py() < 0) throw py::error_already_set();
  m.def("create", &create, "A native-floor backend on a duplicate of an mpi4py communicator",
        py::arg("comm"), py::arg("gated"), py::arg("timeout_s"), py::arg("spin_s"),
        py::arg("nap_s"));
}
