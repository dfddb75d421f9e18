// message.cc — binary (de)serialization of negotiation messages and the
// request signature used for validation and the response cache.
#include "message.h"

#include <cstring>
#include <sstream>

namespace gradflow {
namespace {

class Writer {
 public:
  template <typename T>
  void pod(const T& v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    out.insert(out.end(), p, p + sizeof(T));
  }
  void str(const std::string& s) {
    pod<uint64_t>(s.size());
    out.insert(out.end(), s.begin(), s.end());
  }
  void i64s(const std::vector<int64_t>& v) {
    pod<uint64_t>(v.size());
    for (int64_t x : v) pod(x);
  }
  std::vector<uint8_t> out;
};

class Reader {
 public:
  explicit Reader(const std::vector<uint8_t>& b) : bytes(b) {}
  template <typename T>
  T pod() {
    GF_CHECK(pos + sizeof(T) <= bytes.size(), "gradflow: truncated negotiation message");
    T v;
    std::memcpy(&v, bytes.data() + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }
  std::string str() {
    auto n = pod<uint64_t>();
    GF_CHECK(pos + n <= bytes.size(), "gradflow: truncated negotiation message");
    std::string s(reinterpret_cast<const char*>(bytes.data() + pos), n);
    pos += n;
    return s;
  }
  std::vector<int64_t> i64s() {
    auto n = pod<uint64_t>();
    std::vector<int64_t> v(n);
    for (auto& x : v) x = pod<int64_t>();
    return v;
  }
  const std::vector<uint8_t>& bytes;
  size_t pos = 0;
};

}  // namespace

int64_t Request::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string Request::signature() const {
  std::ostringstream os;
  os << op_kind_name(kind) << " dtype=" << dtype_name(dtype);
  switch (kind) {
    case OpKind::kAllreduce:
      os << " shape=" << shape_string(shape) << " op=" << reduce_op_name(op)
         << " wire=" << wire_dtype_name(wire) << " prescale=" << prescale
         << " postscale=" << postscale << " sparse_ratio=" << sparse_ratio
         << " in_pool=" << in_pool;
      break;
    case OpKind::kBroadcast:
      os << " shape=" << shape_string(shape) << " root=" << root;
      break;
    case OpKind::kReducescatter:
      os << " shape=" << shape_string(shape) << " op=" << reduce_op_name(op);
      break;
    case OpKind::kAllgather:
    case OpKind::kAlltoall: {
      // The first dimension may differ between ranks; the rest may not.
      std::vector<int64_t> rest(shape.size() > 1 ? shape.begin() + 1 : shape.end(), shape.end());
      os << " rank=" << shape.size() << " trailing_shape=" << shape_string(rest);
      break;
    }
    case OpKind::kBarrier:
    case OpKind::kJoin:
      break;
  }
  return os.str();
}

std::vector<uint8_t> serialize(const RequestMessage& list) {
  Writer w;
  w.pod<uint8_t>(list.shutdown);
  w.str(list.abort_message);
  w.pod<uint64_t>(list.requests.size());
  for (const auto& r : list.requests) {
    w.pod(r.rank);
    w.pod(r.kind);
    w.str(r.name);
    w.pod(r.dtype);
    w.i64s(r.shape);
    w.pod(r.op);
    w.pod(r.root);
    w.pod(r.wire);
    w.pod(r.prescale);
    w.pod(r.postscale);
    w.i64s(r.splits);
    w.pod(r.sparse_ratio);
    w.pod<uint8_t>(r.in_pool);
  }
  return w.out;
}

RequestMessage deserialize_requests(const std::vector<uint8_t>& bytes) {
  Reader rd(bytes);
  RequestMessage list;
  list.shutdown = rd.pod<uint8_t>() != 0;
  list.abort_message = rd.str();
  auto n = rd.pod<uint64_t>();
  list.requests.resize(n);
  for (auto& r : list.requests) {
    r.rank = rd.pod<int32_t>();
    r.kind = rd.pod<OpKind>();
    r.name = rd.str();
    r.dtype = rd.pod<DataType>();
    r.shape = rd.i64s();
    r.op = rd.pod<ReduceOp>();
    r.root = rd.pod<int32_t>();
    r.wire = rd.pod<WireDtype>();
    r.prescale = rd.pod<double>();
    r.postscale = rd.pod<double>();
    r.splits = rd.i64s();
    r.sparse_ratio = rd.pod<double>();
    r.in_pool = rd.pod<uint8_t>() != 0;
  }
  return list;
}

std::vector<uint8_t> serialize(const ResponseMessage& list) {
  Writer w;
  w.pod<uint8_t>(list.shutdown);
  w.str(list.abort_message);
  w.pod<uint64_t>(list.responses.size());
  for (const auto& r : list.responses) {
    w.pod(r.kind);
    w.str(r.name);
    w.str(r.error);
    w.pod(r.dtype);
    w.i64s(r.shape);
    w.pod(r.op);
    w.pod(r.root);
    w.pod(r.wire);
    w.pod(r.prescale);
    w.pod(r.postscale);
    w.pod(r.sparse_ratio);
    w.pod<uint8_t>(r.in_pool);
    w.i64s(r.first_dims);
    w.i64s(r.splits);
    w.pod(r.cache_bit);
  }
  return w.out;
}

ResponseMessage deserialize_responses(const std::vector<uint8_t>& bytes) {
  Reader rd(bytes);
  ResponseMessage list;
  list.shutdown = rd.pod<uint8_t>() != 0;
  list.abort_message = rd.str();
  auto n = rd.pod<uint64_t>();
  list.responses.resize(n);
  for (auto& r : list.responses) {
    r.kind = rd.pod<OpKind>();
    r.name = rd.str();
    r.error = rd.str();
    r.dtype = rd.pod<DataType>();
    r.shape = rd.i64s();
    r.op = rd.pod<ReduceOp>();
    r.root = rd.pod<int32_t>();
    r.wire = rd.pod<WireDtype>();
    r.prescale = rd.pod<double>();
    r.postscale = rd.pod<double>();
    r.sparse_ratio = rd.pod<double>();
    r.in_pool = rd.pod<uint8_t>() != 0;
    r.first_dims = rd.i64s();
    r.splits = rd.i64s();
    r.cache_bit = rd.pod<int32_t>();
  }
  return list;
}

}  // namespace gradflow
