// work.cpp — the handles torch waits on: WorkDtrain and its Completer.
//
// A torch op becomes one or more dtrain ops (dt_submit), each with a
// dt_work handle that must be waited exactly once. WorkDtrain holds them
// with the tensors they touch and a step to run after (copying a result
// into the caller's non-contiguous tensor, unpacking a gathered buffer).
// Settling — waiting for the handles, running that step, recording the
// outcome — happens exactly once, on whichever thread asks first:
//   - wait() on the caller's thread: the common case, no hand-off;
//   - the Completer thread, once torch asked for a future (DDP's
//     communication hooks chain callbacks on it, and torch has no other
//     way to learn that the op is done): it settles futures' works in the
//     order they were asked for and completes the futures.
// A failed op's exception is a std::runtime_error carrying the
// communicator's message (rank, peer, op, sequence number, cause), which
// Python sees as RuntimeError. Cost: one mutex per settle, and for a
// future one hand-off to the completer thread.
//
// Deferral. A torch op waited at once (every call without async_op) would
// pay two thread hand-offs if submitted at once: to the communicator's
// thread and back. So a lone collective is deferred (process_group.cpp
// keeps at most one, pending_): if its own wait() comes first it runs
// inline on the waiting thread (dt_run, no hand-off); anything else —
// the next op, a future, isCompleted — submits it first, in order.
#include <stdexcept>
#include <string>

#include "process_group.hpp"

namespace dtrain_torch
{

WorkDtrain::WorkDtrain(dt_comm *comm, int rank, c10d::OpType type, const char *name,
                       std::vector<dt_work *> handles, std::vector<at::Tensor> keep,
                       std::function<void()> after, std::vector<at::Tensor> outputs,
                       std::shared_ptr<int> source, ProcessGroupDtrain *pg)
    : c10d::Work(rank, type), handles_(std::move(handles)), comm_(comm), name_(name),
      keep_(std::move(keep)), after_(std::move(after)), outputs_(std::move(outputs)),
      source_(std::move(source)), pg_(pg)
{
}

// Every dtrain handle is waited exactly once, also when torch drops an op
// it never waited for.
WorkDtrain::~WorkDtrain()
{
    settle();
}

void WorkDtrain::settle()
{
    {
        std::lock_guard<std::mutex> g(claim_mu_);
        if (claimed_)
            return;
        claimed_ = true;
    }
    pg_->run_deferred(this, true);
    dt_status first = ran;
    for (dt_work *h : handles_) {
        dt_status st = dt_work_wait(h);
        if (first == DT_OK)
            first = st;
    }
    handles_.clear();
    std::exception_ptr err;
    if (first != DT_OK) {
        std::string why = dt_comm_error(comm_);
        err = std::make_exception_ptr(std::runtime_error(
            std::string("dtrain ") + name_ + ": " + (why.empty() ? dt_status_name(first) : why)));
    } else {
        try {
            if (after_)
                after_();
        } catch (...) {
            err = std::current_exception();
        }
    }
    after_ = nullptr;
    keep_.clear();
    finish(err);
    {
        std::lock_guard<std::mutex> g(claim_mu_);
        settled_ = true;
        error_ = err;
    }
    mark_future();
}

// Completes the future once, outside the lock: its callbacks (DDP's) run
// here, and may call back into this work.
void WorkDtrain::mark_future()
{
    c10::intrusive_ptr<c10::ivalue::Future> f;
    std::exception_ptr err;
    {
        std::lock_guard<std::mutex> g(claim_mu_);
        if (!future_ || !settled_ || future_marked_)
            return;
        future_marked_ = true;
        f = future_;
        err = error_;
    }
    if (err)
        f->setError(err);
    else
        f->markCompleted(c10::IValue(outputs_));
}

bool WorkDtrain::isCompleted()
{
    pg_->run_deferred(this, false);
    {
        std::lock_guard<std::mutex> g(claim_mu_);
        if (claimed_)
            return c10d::Work::isCompleted();
        for (dt_work *h : handles_)
            if (!dt_work_test(h))
                return false;
    }
    settle(); /* every handle is done: this does not block */
    return c10d::Work::isCompleted();
}

bool WorkDtrain::wait(std::chrono::milliseconds timeout)
{
    settle();
    return c10d::Work::wait(timeout);
}

int WorkDtrain::sourceRank() const
{
    if (!source_)
        throw std::runtime_error(std::string("dtrain ") + name_ +
                                 ": sourceRank is a receive's (recvAnysource)");
    return *source_;
}

std::vector<at::Tensor> WorkDtrain::result()
{
    return outputs_;
}

c10::intrusive_ptr<c10::ivalue::Future> WorkDtrain::getFuture()
{
    bool queue = false;
    {
        std::lock_guard<std::mutex> g(claim_mu_);
        if (!future_) {
            future_ = c10::make_intrusive<c10::ivalue::Future>(
                c10::ListType::create(c10::TensorType::get()));
            queue = !claimed_;
        }
    }
    pg_->run_deferred(this, false); /* submitted now: the op overlaps what follows */
    if (queue)
        pg_->completer()->enqueue(
            c10::intrusive_ptr<WorkDtrain>::unsafe_reclaim_from_nonowning(this));
    else
        mark_future(); /* settled already, or being settled: whoever ends marks it */
    return future_;
}

Completer::Completer() : thread_([this] { run(); })
{
}

Completer::~Completer()
{
    {
        std::lock_guard<std::mutex> g(mu_);
        stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
}

void Completer::enqueue(c10::intrusive_ptr<WorkDtrain> w)
{
    {
        std::lock_guard<std::mutex> g(mu_);
        queue_.push_back(std::move(w));
    }
    cv_.notify_one();
}

void Completer::run()
{
    for (;;) {
        c10::intrusive_ptr<WorkDtrain> w;
        {
            std::unique_lock<std::mutex> lock(mu_);
            cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
            if (queue_.empty())
                return; /* stopping, and nothing left to settle */
            w = std::move(queue_.front());
            queue_.pop_front();
        }
        w->settle();
    }
}

} // namespace dtrain_torch

namespace dtrain_torch
{

void ProcessGroupDtrain::flush_locked()
{
    WorkDtrain *w = pending_;
    if (!w)
        return;
    pending_ = nullptr;
    dt_work *h = nullptr;
    w->ran = dt_submit(comm_, &w->deferred, &h);
    if (w->ran == DT_OK)
        w->handles_.push_back(h);
}

void ProcessGroupDtrain::run_deferred(WorkDtrain *w, bool inline_ok)
{
    std::lock_guard<std::mutex> g(submit_mu_);
    if (pending_ != w)
        return; /* never deferred, or submitted already */
    if (!inline_ok)
        return flush_locked();
    pending_ = nullptr;
    w->ran = dt_run(comm_, &w->deferred); /* holding the lock: in order */
}

} // namespace dtrain_torch
