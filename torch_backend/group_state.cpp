// group_state.cpp — what a ProcessGroupDtrain and its works share.
//
// torch lets a Work outlive its process group: dist.destroy_process_group()
// drops the group while the user still holds the works of async ops, and
// may wait() on them or ask is_completed() later. So the communicator and
// everything a work touches on its way (the submission lock, the deferred
// op, the completer) live in a GroupState that the group and every work
// hold by shared_ptr; the communicator is destroyed with the last holder.
// When the group goes (close) its deferred op is submitted and its
// completer stopped (after settling the works queued on it), so a work
// left behind runs on the communicator's thread and is settled by whoever
// waits or looks: a wait() then completes, or raises the op's error,
// instead of touching freed memory. Cost: one reference count per op.
#include "process_group.hpp"

namespace dtrain_torch
{

GroupState::~GroupState()
{
    dt_comm_destroy(comm);
}

void GroupState::flush_locked()
{
    WorkDtrain *w = pending;
    if (!w)
        return;
    pending = nullptr;
    dt_work *h = nullptr;
    w->ran = dt_submit(comm, &w->deferred, &h);
    if (w->ran == DT_OK)
        w->handles_.push_back(h);
}

void GroupState::run_deferred(WorkDtrain *w, bool inline_ok)
{
    std::lock_guard<std::mutex> g(submit_mu);
    if (pending != w)
        return; /* never deferred, or submitted already */
    if (!inline_ok)
        return flush_locked();
    pending = nullptr;
    w->ran = dt_run(comm, &w->deferred); /* holding the lock: in order */
}

void GroupState::limit_deferred(WorkDtrain *w, double seconds)
{
    std::lock_guard<std::mutex> g(submit_mu);
    if (pending == w && (w->deferred.timeout_s == 0 || w->deferred.timeout_s > seconds))
        w->deferred.timeout_s = seconds;
}

bool GroupState::complete_later(const c10::intrusive_ptr<WorkDtrain> &w)
{
    std::lock_guard<std::mutex> g(submit_mu); /* close() takes the completer under it */
    if (!completer)
        return false;
    completer->enqueue(w);
    return true;
}

void GroupState::close()
{
    std::unique_ptr<Completer> c;
    {
        std::lock_guard<std::mutex> g(submit_mu);
        flush_locked();
        c = std::move(completer);
    }
    c.reset(); /* settles the works queued on it, then joins */
}

} // namespace dtrain_torch
