// process_group.hpp — torch.distributed's "dtrain" backend: a c10d
// ProcessGroup whose collectives run on a dtrain communicator.
//
// process_group.cpp (the ops) and work.cpp (their handles) say how;
// group_state.cpp what the group and its works share.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "dt_comm.h"

namespace dtrain_torch
{

class Completer;
class WorkDtrain;
struct Blocks;

// What a group and every work it made share: the communicator, the lock
// that keeps submissions in torch's order, the deferred op and the
// completer. Shared ownership (group_state.cpp): a work that outlives its
// group — dist.destroy_process_group() with an op in flight — still waits
// on a live communicator, destroyed with the last holder.
struct GroupState {
    dt_comm *comm = nullptr;
    std::mutex submit_mu;                 // dt_comm's API: one thread at a time
    WorkDtrain *pending = nullptr;        // the deferred lone collective, if any
    std::unique_ptr<Completer> completer; // null once the group is gone
    ~GroupState();                        // dt_comm_destroy
    void flush_locked();                  // submits pending; holds submit_mu
    // The deferred op of w, if it still is: run here and now (inline), or
    // submitted (for a future, or a look without waiting).
    void run_deferred(WorkDtrain *w, bool inline_ok);
    // A deferred w, when run inline, gives up after at most `seconds`.
    void limit_deferred(WorkDtrain *w, double seconds);
    // Hands w to the completer; false once the group is gone (no completer).
    bool complete_later(const c10::intrusive_ptr<WorkDtrain> &w);
    // The group is gone: the deferred op submitted, the completer stopped.
    void close();
};

// One torch op's handle: the dtrain work handles it submitted, the tensors
// they read and write, and what runs once they are done (copies into the
// caller's tensors). Settled exactly once, by whoever comes first: wait()
// on the caller's thread, or the completer thread when torch asked for a
// future (DDP's communication hooks do).
class WorkDtrain : public c10d::Work
{
  public:
    WorkDtrain(std::shared_ptr<GroupState> group, int rank, c10d::OpType type, const char *name,
               std::vector<dt_work *> handles, std::vector<at::Tensor> keep,
               std::function<void()> after, std::vector<at::Tensor> outputs,
               std::shared_ptr<int> source);
    ~WorkDtrain() override;
    bool isCompleted() override;
    bool wait(std::chrono::milliseconds timeout) override;
    int sourceRank() const override;
    std::vector<at::Tensor> result() override;
    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
    void settle(); // waits for the handles; no-op if already settled

    // A lone collective is not submitted at once but deferred (its op
    // here), so that the wait() that usually follows runs it on the
    // caller's thread (process_group.cpp); the group's lock guards these.
    dt_op deferred{};
    dt_status ran = DT_OK;           // the deferred op's status, once run inline
    std::vector<dt_work *> handles_; // what it submitted (the deferred op's, once flushed)

  private:
    std::shared_ptr<GroupState> group_;
    const char *name_;
    std::vector<at::Tensor> keep_;
    std::function<void()> after_;
    std::vector<at::Tensor> outputs_;
    std::shared_ptr<int> source_; // a receive's sender, written by dtrain
    std::mutex claim_mu_;
    bool claimed_ = false, settled_ = false, future_marked_ = false;
    std::exception_ptr error_;
    c10::intrusive_ptr<c10::ivalue::Future> future_;
    void mark_future();
    bool done_within(std::chrono::milliseconds timeout);
};

// A thread that settles the works whose futures torch holds, in order.
class Completer
{
  public:
    Completer();
    ~Completer(); // settles what is queued, then joins
    void enqueue(c10::intrusive_ptr<WorkDtrain> w);

  private:
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<c10::intrusive_ptr<WorkDtrain>> queue_;
    bool stopping_ = false;
    std::thread thread_;
    void run();
};

class ProcessGroupDtrain : public c10d::ProcessGroup
{
  public:
    ProcessGroupDtrain(const c10::intrusive_ptr<c10d::Store> &store, int rank, int size,
                       std::chrono::milliseconds timeout);
    ~ProcessGroupDtrain() override;
    // Backend.register_backend's creator: (store, rank, world_size, timeout).
    static c10::intrusive_ptr<c10d::ProcessGroup>
    create(const c10::intrusive_ptr<c10d::Store> &store, int rank, int size,
           std::chrono::duration<float> timeout);
    const std::string getBackendName() const override
    {
        return "dtrain";
    }

    using Tensors = std::vector<at::Tensor>;
    using WorkPtr = c10::intrusive_ptr<c10d::Work>;
    WorkPtr broadcast(Tensors &t, const c10d::BroadcastOptions &o) override;
    WorkPtr allreduce(Tensors &t, const c10d::AllreduceOptions &o) override;
    WorkPtr allreduce_coalesced(Tensors &t, const c10d::AllreduceCoalescedOptions &o) override;
    WorkPtr reduce(Tensors &t, const c10d::ReduceOptions &o) override;
    WorkPtr allgather(std::vector<Tensors> &out, Tensors &in,
                      const c10d::AllgatherOptions &o) override;
    WorkPtr _allgather_base(at::Tensor &out, at::Tensor &in,
                            const c10d::AllgatherOptions &o) override;
    WorkPtr allgather_coalesced(std::vector<Tensors> &out, Tensors &in,
                                const c10d::AllgatherOptions &o) override;
    WorkPtr gather(std::vector<Tensors> &out, Tensors &in, const c10d::GatherOptions &o) override;
    WorkPtr scatter(Tensors &out, std::vector<Tensors> &in, const c10d::ScatterOptions &o) override;
    WorkPtr reduce_scatter(Tensors &out, std::vector<Tensors> &in,
                           const c10d::ReduceScatterOptions &o) override;
    WorkPtr _reduce_scatter_base(at::Tensor &out, at::Tensor &in,
                                 const c10d::ReduceScatterOptions &o) override;
    WorkPtr alltoall_base(at::Tensor &out, at::Tensor &in, std::vector<int64_t> &out_splits,
                          std::vector<int64_t> &in_splits, const c10d::AllToAllOptions &o) override;
    WorkPtr alltoall(Tensors &out, Tensors &in, const c10d::AllToAllOptions &o) override;
    WorkPtr send(Tensors &t, int dst, int tag) override;
    WorkPtr recv(Tensors &t, int src, int tag) override;
    WorkPtr recvAnysource(Tensors &t, int tag) override;
    WorkPtr barrier(const c10d::BarrierOptions &o) override;

  private:
    std::shared_ptr<GroupState> state_;

    struct Launch; // ops_common.hpp
    c10::intrusive_ptr<WorkDtrain> launch(Launch &l);
    int64_t agree_max(int64_t mine, const char *op);
    WorkPtr padded_alltoall(Launch &l, const Blocks &b, std::chrono::milliseconds timeout);
    WorkPtr p2p(Tensors &ts, int peer, int tag, bool is_send, c10d::OpType type, const char *name);
};

} // namespace dtrain_torch
