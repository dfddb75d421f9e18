// python_kernel_bindings.cc — pybind11 defs of pure kernels (wire codec,
// CSC chunk selection, fusion planning), exposed so unit tests can check
// them without MPI or a runtime.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <tuple>
#include <vector>

#include "fusion_buffer.h"
#include "sparse_chunks.h"
#include "sparse_pool_residual.h"
#include "python_runtime.h"
#include "wire_codec.h"

namespace py = pybind11;
using namespace gradflow;
using namespace gradflow::binding;

void gradflow::binding::bind_kernels(py::module_& m) {
  m.def("encode_f32", [](int wire, py::array_t<float, py::array::c_style | py::array::forcecast> a) {
          py::array_t<uint16_t> out(a.size());
          bool overflow = encode_f32(static_cast<WireDtype>(wire), a.data(), out.mutable_data(),
                                     a.size());
          return py::make_tuple(out, overflow);
        });
  m.def("decode_f32", [](int wire, py::array_t<uint16_t, py::array::c_style> a) {
          py::array_t<float> out(a.size());
          decode_f32(static_cast<WireDtype>(wire), a.data(), out.mutable_data(), a.size());
          return out;
        });
  m.def("decode_accumulate_f32",
        [](int wire, py::array_t<uint16_t, py::array::c_style> src, py::array_t<float> dst) {
          GF_CHECK(src.size() == dst.size(), "size mismatch");
          decode_accumulate_f32(static_cast<WireDtype>(wire), src.data(), dst.mutable_data(),
                                src.size());
        });
  m.def("set_codec_simd_enabled", &set_codec_simd_enabled);
  m.def("codec_simd_available", &codec_simd_available);
  m.def("codec_impl_name", &codec_impl_name);
  m.def("select_top_chunks", &select_top_chunks);
  m.def("sparse_residual_elements",
        [] { return SparseResidual::live_elements() + PoolResidual::live_elements(); },
        "Elements held by live CSC residuals in this process (for tests).");
  m.def("chunk_importance", [](py::array_t<float, py::array::c_style | py::array::forcecast> a,
                               size_t chunk) {
          std::vector<float> imp;
          chunk_importance(a.data(), a.size(), chunk, &imp);
          return imp;
        });
  m.def("sampled_chunk_importance",
        [](py::array_t<float, py::array::c_style | py::array::forcecast> a, size_t chunk,
           uint64_t phase) {
          std::vector<float> imp;
          sampled_chunk_importance(a.data(), a.size(), chunk, &imp, phase);
          return imp;
        },
        py::arg("values"), py::arg("chunk"), py::arg("phase") = 0);
  m.def("plan_fusion", [](std::vector<std::tuple<int, int, int, double, double, size_t, bool>> items,
                          size_t threshold) {
          std::vector<FusionItem> v;
          for (auto& t : items)
            v.push_back(FusionItem{static_cast<DataType>(std::get<0>(t)),
                                   static_cast<ReduceOp>(std::get<1>(t)),
                                   static_cast<WireDtype>(std::get<2>(t)), std::get<3>(t),
                                   std::get<4>(t), std::get<5>(t), std::get<6>(t)});
          return plan_fusion(v, threshold);
        },
        "Fusion planning (pure): items are (dtype, op, wire, prescale, postscale, bytes, fusable).");
}
