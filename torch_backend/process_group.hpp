// process_group.hpp — torch.distributed's "dtrain" backend: a c10d
// ProcessGroup whose collectives run on a dtrain communicator.
//
// process_group.cpp (the ops) and work.cpp (their handles) say how.
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
class ProcessGroupDtrain;
struct Blocks;

// One torch op's handle: the dtrain work handles it submitted, the tensors
// they read and write, and what runs once they are done (copies into the
// caller's tensors). Settled exactly once, by whoever comes first: wait()
// on the caller's thread, or the completer thread when torch asked for a
// future (DDP's communication hooks do).
class WorkDtrain : public c10d::Work
{
  public:
    WorkDtrain(dt_comm *comm, int rank, c10d::OpType type, const char *name,
               std::vector<dt_work *> handles, std::vector<at::Tensor> keep,
               std::function<void()> after, std::vector<at::Tensor> outputs,
               std::shared_ptr<int> source, ProcessGroupDtrain *pg);
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
    dt_comm *comm_;
    const char *name_;
    std::vector<at::Tensor> keep_;
    std::function<void()> after_;
    std::vector<at::Tensor> outputs_;
    std::shared_ptr<int> source_; // a receive's sender, written by dtrain
    ProcessGroupDtrain *pg_;
    std::mutex claim_mu_;
    bool claimed_ = false, settled_ = false, future_marked_ = false;
    std::exception_ptr error_;
    c10::intrusive_ptr<c10::ivalue::Future> future_;
    void mark_future();
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

    // The deferred op of w, if it still is: run here and now (inline), or
    // submitted (for a future, or a look without waiting). work.cpp.
    void run_deferred(WorkDtrain *w, bool inline_ok);
    Completer *completer()
    {
        return completer_.get();
    }

  private:
    dt_comm *comm_ = nullptr;
    std::mutex submit_mu_; // dt_comm's API: one thread at a time
    std::unique_ptr<Completer> completer_;
    WorkDtrain *pending_ = nullptr; // the deferred lone collective, if any
    void flush_locked();            // submits pending_; holds submit_mu_

    struct Launch; // ops_common.hpp
    c10::intrusive_ptr<WorkDtrain> launch(Launch &l);
    int64_t agree_max(int64_t mine, const char *op);
    WorkPtr padded_alltoall(Launch &l, const Blocks &b, std::chrono::milliseconds timeout);
    WorkPtr p2p(Tensors &ts, int peer, int tag, bool is_send, c10d::OpType type, const char *name);
};

} // namespace dtrain_torch
