// message.cc — binary (de)serialization of negotiation messages and the
// request signature used for validation and the response cache.
#include "message.h"

#include <charconv>
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
  template <typename T>
  void field(const T& v) { pod(v); }
  void field(const bool& v) { pod<uint8_t>(v); }
  void field(const std::string& v) { str(v); }
  void field(const std::vector<int64_t>& v) { i64s(v); }
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
    GF_CHECK(n <= bytes.size(), "gradflow: corrupt negotiation message");
    std::vector<int64_t> v(n);
    for (auto& x : v) x = pod<int64_t>();
    return v;
  }
  template <typename T>
  void field(T& v) { v = pod<T>(); }
  void field(bool& v) { v = pod<uint8_t>() != 0; }
  void field(std::string& v) { v = str(); }
  void field(std::vector<int64_t>& v) { v = i64s(); }
  const std::vector<uint8_t>& bytes;
  size_t pos = 0;
};

}  // namespace

int64_t Request::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {

// The shortest text that reads back as exactly `v`: ranks whose factors
// differ in the last bit must not agree (a stream's default 6 digits made
// prescale 1.0 and 1.000004 "equal", and rank 0's was used everywhere).
std::string exact(double v) {
  char buf[32];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, res.ptr);
}

}  // namespace

std::string Request::signature() const {
  std::ostringstream os;
  os << op_kind_name(kind) << " dtype=" << dtype_name(dtype);
  switch (kind) {
    case OpKind::kAllreduce:
      os << " shape=" << shape_string(shape) << " op=" << reduce_op_name(op)
         << " wire=" << wire_dtype_name(wire) << " prescale=" << exact(prescale)
         << " postscale=" << exact(postscale) << " sparse_ratio=" << exact(sparse_ratio)
         << " in_pool=" << in_pool;
      if (!step_tag.empty()) os << " step={" << step_tag << "}";
      break;
    case OpKind::kBroadcast:
      os << " shape=" << shape_string(shape) << " root=" << root;
      break;
    case OpKind::kReducescatter:
      // The response carries rank 0's factors and wire: every rank must give the same.
      os << " shape=" << shape_string(shape) << " op=" << reduce_op_name(op)
         << " wire=" << wire_dtype_name(wire) << " prescale=" << exact(prescale)
         << " postscale=" << exact(postscale);
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
  if (group_size > 0) os << " group_of=" << group_size;
  if (!withdrawn.empty()) os << " withdrawn";
  return os.str();
}

namespace {

// One field list per message type, walked by both the Writer and the Reader
// so serialization and deserialization cannot drift apart.
template <typename Archive>
void fields(Archive& a, Request& r) {
  a.field(r.rank);
  a.field(r.kind);
  a.field(r.name);
  a.field(r.dtype);
  a.field(r.shape);
  a.field(r.op);
  a.field(r.root);
  a.field(r.wire);
  a.field(r.prescale);
  a.field(r.postscale);
  a.field(r.splits);
  a.field(r.sparse_ratio);
  a.field(r.in_pool);
  a.field(r.step_tag);
  a.field(r.group_size);
  a.field(r.withdrawn);
}

template <typename Archive>
void fields(Archive& a, Response& r) {
  a.field(r.kind);
  a.field(r.name);
  a.field(r.error);
  a.field(r.dtype);
  a.field(r.shape);
  a.field(r.op);
  a.field(r.root);
  a.field(r.wire);
  a.field(r.prescale);
  a.field(r.postscale);
  a.field(r.sparse_ratio);
  a.field(r.in_pool);
  a.field(r.first_dims);
  a.field(r.splits);
  a.field(r.cache_bit);
}

// The list a message carries (its items are walked with fields()).
std::vector<Request>& items(RequestMessage& m) { return m.requests; }
std::vector<Response>& items(ResponseMessage& m) { return m.responses; }

// A message's flags, then its item count and items: one walk for both
// message types and both directions.
template <typename Archive>
void own_fields(Archive& a, RequestMessage& m) {
  a.field(m.joined);
}
template <typename Archive>
void own_fields(Archive& a, ResponseMessage& m) {
  a.field(m.shutdown_ranks);
}

template <typename Archive, typename Message>
void message_fields(Archive& a, Message& m) {
  a.field(m.shutdown);
  a.field(m.abort_message);
  own_fields(a, m);
  auto& list = items(m);
  uint64_t n = list.size();
  a.field(n);
  GF_CHECK(n < (uint64_t{1} << 32), "gradflow: corrupt negotiation message");
  list.resize(n);
  for (auto& it : list) fields(a, it);
}

template <typename Message>
std::vector<uint8_t> write_message(const Message& list) {
  Writer w;
  // The walk is shared with the Reader, so it takes a non-const message;
  // the Writer only reads it (the resize() keeps the size it has).
  message_fields(w, const_cast<Message&>(list));
  return w.out;
}

template <typename Message>
Message read_message(const std::vector<uint8_t>& bytes) {
  Reader rd(bytes);
  Message m;
  message_fields(rd, m);
  return m;
}

}  // namespace

std::vector<uint8_t> serialize(const RequestMessage& list) { return write_message(list); }

RequestMessage deserialize_requests(const std::vector<uint8_t>& bytes) {
  return read_message<RequestMessage>(bytes);
}

std::vector<uint8_t> serialize(const ResponseMessage& list) { return write_message(list); }

ResponseMessage deserialize_responses(const std::vector<uint8_t>& bytes) {
  return read_message<ResponseMessage>(bytes);
}

}  // namespace gradflow
