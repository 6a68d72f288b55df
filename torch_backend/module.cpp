// module.cpp — the Python module dtrain_torch.
//
// `import dtrain_torch` registers the torch.distributed backend "dtrain"
// (Backend.register_backend), after which
// `dist.init_process_group("dtrain", ...)` makes a ProcessGroupDtrain
// (process_group.hpp) through create_process_group(store, rank,
// world_size, timeout), torch's creator signature. The GIL is released
// while the ranks rendezvous and connect, which blocks.
#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>

#include "process_group.hpp"

namespace py = pybind11;

PYBIND11_MODULE(dtrain_torch, m)
{
    m.doc() = "torch.distributed backend \"dtrain\": collectives on libdtrain";
    auto dist = py::module_::import("torch.distributed");
    py::class_<dtrain_torch::ProcessGroupDtrain, c10d::ProcessGroup,
               c10::intrusive_ptr<dtrain_torch::ProcessGroupDtrain>>(m, "ProcessGroupDtrain");
    m.def("create_process_group", &dtrain_torch::ProcessGroupDtrain::create, py::arg("store"),
          py::arg("rank"), py::arg("world_size"), py::arg("timeout"),
          py::call_guard<py::gil_scoped_release>(),
          "Backend.register_backend's creator: joins the group through the store");
    py::object backend = dist.attr("Backend");
    if (!py::hasattr(backend, "DTRAIN"))
        backend.attr("register_backend")("dtrain", m.attr("create_process_group"));
}
