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
// keeps at most one, GroupState::pending): if its own wait() comes first it runs
// inline on the waiting thread (dt_run, no hand-off); anything else —
// the next op, a future, isCompleted — submits it first, in order.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "process_group.hpp"

namespace dtrain_torch
{

WorkDtrain::WorkDtrain(std::shared_ptr<GroupState> group, int rank, c10d::OpType type,
                       const char *name, std::vector<dt_work *> handles,
                       std::vector<at::Tensor> keep, std::function<void()> after,
                       std::vector<at::Tensor> outputs, std::shared_ptr<int> source)
    : c10d::Work(rank, type), handles_(std::move(handles)), group_(std::move(group)), name_(name),
      keep_(std::move(keep)), after_(std::move(after)), outputs_(std::move(outputs)),
      source_(std::move(source))
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
    group_->run_deferred(this, true);
    dt_status first = ran;
    for (dt_work *h : handles_) {
        dt_status st = dt_work_wait(h);
        if (first == DT_OK)
            first = st;
    }
    handles_.clear();
    std::exception_ptr err;
    if (first != DT_OK) {
        std::string why = dt_comm_error(group_->comm);
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
    group_->run_deferred(this, false);
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

// wait(timeout), as torch passes it (work.wait(timeout=...)): a deferred op
// runs inline under that limit, so dtrain's own timeout names the op; a
// submitted one is watched until the limit, then the wait raises while the
// op runs on (torch's Work::wait does the same), to the group's limit.
bool WorkDtrain::wait(std::chrono::milliseconds timeout)
{
    if (timeout != ::kNoTimeout) {
        group_->limit_deferred(this, timeout.count() / 1000.0);
        if (!done_within(timeout))
            throw std::runtime_error(std::string("dtrain ") + name_ + ": rank " +
                                     std::to_string(rank_) + ": wait timed out after " +
                                     std::to_string(timeout.count()) +
                                     " ms; the op runs on until the group's timeout");
    }
    settle();
    return c10d::Work::wait(timeout);
}

// True once every submitted handle is done, false if the limit passes
// first; polls, sleeping from 50 µs up to 1 ms between looks.
bool WorkDtrain::done_within(std::chrono::milliseconds timeout)
{
    auto deadline = std::chrono::steady_clock::now() + timeout;
    auto nap = std::chrono::microseconds(50);
    for (;;) {
        {
            std::lock_guard<std::mutex> g(claim_mu_);
            if (claimed_)
                return true; /* settled, or being settled: settle() waits for it */
            bool done = true;
            for (dt_work *h : handles_)
                done = done && dt_work_test(h);
            if (done)
                return true;
        }
        if (std::chrono::steady_clock::now() >= deadline)
            return false;
        std::this_thread::sleep_for(nap);
        nap = std::min(nap * 2, std::chrono::microseconds(1000));
    }
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
    group_->run_deferred(this, false); /* submitted now: the op overlaps what follows */
    if (!queue || !group_->complete_later(
                      c10::intrusive_ptr<WorkDtrain>::unsafe_reclaim_from_nonowning(this)))
        settle();  /* the group is gone, so is its completer: settled here, now */
    mark_future(); /* whoever settles or asks last marks it, once */
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
