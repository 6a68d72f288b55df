// store_adapter.hpp — torch's c10d::Store behind dtrain's store interface.
//
// store_adapter.cpp says how; this is what process_group.cpp needs.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "dt_comm.h"

namespace dtrain_torch
{

// The table of dt_store_ops whose `user` is a c10d::Store*: open it with
// dt_store_open_ops(&s, store_ops(), store.get(), "torch store", job).
const dt_store_ops *store_ops();

} // namespace dtrain_torch
