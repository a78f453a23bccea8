// A backend that lives in the tests only, to hold the backend seam (te/distributed/backend.h) to
// its promise: a transport te-cpp does not know, added by its own file and one registration line,
// carries every collective. This one moves tensors through the world's c10d store (slowly: each
// rank posts its bytes under a key of its own and reads its peers'), and reduces in rank order,
// so every rank gets the same bits. te_store_backend_tests runs the collectives suite
// (test_redistribute.cpp) with TE_COMM_BACKEND=store; the test below checks it carried them.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "../expect_error.h"
#include "te/distributed.h"
#include "te/distributed/backend.h"

namespace te {
namespace {

class StoreBackend final : public comm::Backend {
 public:
  explicit StoreBackend(const comm::BackendSetup& setup)
      : store_(setup.store), rank_(setup.rank), size_(setup.size), timeout_(setup.timeout) {
    barrier();  // joined when every rank of the row is here
  }

  bool moves(const c10::Device& device) const override { return device.is_cpu(); }
  at::ScalarType reduce_dtype(at::ScalarType dtype) const override {
    return dtype == at::kBFloat16 || dtype == at::kHalf ? at::kFloat : dtype;
  }

  const char* all_reduce(at::Tensor& t, ReduceOp op) override {
    const std::string call = next_call();
    post(call + "/" + std::to_string(rank_), t);
    t.copy_(reduce(gather_all(call, t), op));
    return "store_all_reduce";
  }

  const char* all_gather(const at::Tensor& in, at::Tensor& out) override {
    const std::string call = next_call();
    post(call + "/" + std::to_string(rank_), in);
    out.view({size_, in.numel()}).copy_(gather_all(call, in));
    return "store_all_gather";
  }

  const char* reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op) override {
    const std::string call = next_call();
    post(call + "/" + std::to_string(rank_), in);
    const at::Tensor all = gather_all(call, in);  // [size, in.numel()]
    out.copy_(reduce(all.view({size_, size_, in.numel() / size_}).select(1, rank_), op));
    return "store_reduce_scatter";
  }

  const char* all_to_all(const at::Tensor& in, at::Tensor& out,
                         const std::vector<int64_t>& in_sizes,
                         const std::vector<int64_t>& out_sizes) override {
    const std::string call = next_call();
    int64_t at_in = 0;
    for (int s = 0; s < size_; ++s) {
      post(call + "/" + std::to_string(rank_) + ">" + std::to_string(s),
           in.narrow(0, at_in, in_sizes[static_cast<std::size_t>(s)]));
      at_in += in_sizes[static_cast<std::size_t>(s)];
    }
    int64_t at_out = 0;
    for (int s = 0; s < size_; ++s) {
      at::Tensor piece = out.narrow(0, at_out, out_sizes[static_cast<std::size_t>(s)]);
      read(call + "/" + std::to_string(s) + ">" + std::to_string(rank_), piece);
      at_out += out_sizes[static_cast<std::size_t>(s)];
    }
    return "store_all_to_all";
  }

  void barrier() override {
    const std::string call = next_call();
    store_->set(call + "/" + std::to_string(rank_), std::vector<uint8_t>{1});
    store_->wait(keys(call), timeout_);
  }

 private:
  std::string next_call() { return "call" + std::to_string(calls_++); }

  std::vector<std::string> keys(const std::string& call) const {
    std::vector<std::string> out;
    for (int s = 0; s < size_; ++s) out.push_back(call + "/" + std::to_string(s));
    return out;
  }

  void post(const std::string& key, const at::Tensor& t) {
    const at::Tensor c = t.contiguous();
    const auto* p = static_cast<const uint8_t*>(c.data_ptr());
    store_->set(key, std::vector<uint8_t>(p, p + c.nbytes()));
  }

  void read(const std::string& key, at::Tensor& into) {
    store_->wait({key}, timeout_);
    const std::vector<uint8_t> bytes = store_->get(key);
    TE_CHECK(static_cast<int64_t>(bytes.size()) == static_cast<int64_t>(into.nbytes()),
             "store backend: '", key, "' holds ", bytes.size(), " bytes, not ", into.nbytes());
    if (!bytes.empty()) std::memcpy(into.data_ptr(), bytes.data(), bytes.size());
  }

  // Every rank's posting of `call`, as rows of [size, like.numel()].
  at::Tensor gather_all(const std::string& call, const at::Tensor& like) {
    store_->wait(keys(call), timeout_);
    at::Tensor all = at::empty({size_, like.numel()}, like.options());
    for (int s = 0; s < size_; ++s) {
      at::Tensor row = all.select(0, s);
      read(call + "/" + std::to_string(s), row);
    }
    return all;
  }

  // Rows reduced in rank order (the same bits on every rank).
  static at::Tensor reduce(const at::Tensor& rows, ReduceOp op) {
    at::Tensor acc = rows.select(0, 0).clone();
    for (int64_t s = 1; s < rows.size(0); ++s) {
      const at::Tensor r = rows.select(0, s);
      if (op == ReduceOp::kMax) {
        acc = at::maximum(acc, r);
      } else if (op == ReduceOp::kMin) {
        acc = at::minimum(acc, r);
      } else {
        acc.add_(r);
      }
    }
    if (op == ReduceOp::kAvg) acc.div_(rows.size(0));
    return acc;
  }

  c10::intrusive_ptr<c10d::Store> store_;
  int rank_, size_;
  std::chrono::milliseconds timeout_;
  int64_t calls_ = 0;
};

// The one registration line.
const comm::BackendRegistration kStore({"store", {c10::kCPU}, {}, [](const comm::BackendSetup& s) {
                                          return std::make_unique<StoreBackend>(s);
                                        }});

// The collectives of a redistribute and of its backward went through the store, and a tensor on
// a device it does not carry is refused by name.
TEST(StoreBackend, CarriesTheCollectivesItIsNamedFor) {
  ASSERT_EQ(comm::backend_names(), (std::vector<std::string>{"gloo", "nccl", "store"}));
  DistributedOptions options;
  options.backend = "store";
  run_local_ranks(
      2,
      [](int rank) {
        DeviceMesh mesh({2}, {"x"});
        CommTrace trace;
        const at::Tensor whole = at::arange(12, at::kFloat).view({4, 3}).requires_grad_();
        const DTensor x = DTensor::distribute(whole, mesh, {Shard{0}});
        const DTensor r = x.redistribute({Replicate{}});
        EXPECT_TRUE(at::equal(r.to_local(), whole));
        r.to_local().sum().backward();
        const DTensor p = DTensor::from_local(at::full({3}, rank + 1.0), mesh, {Partial{}});
        EXPECT_TRUE(at::equal(p.full_tensor(), at::full({3}, 3.0)));
        ASSERT_GE(trace.total_count(), 2);
        for (const CommRecord& rec : trace.records()) {
          EXPECT_EQ(rec.primitive.rfind("store_", 0), 0u) << rec.primitive;
        }
      },
      options);
  options.timeout = std::chrono::seconds(30);
  EXPECT_ERROR(run_local_ranks(
                   2,
                   [](int) {
                     DeviceMesh mesh({2}, {"x"});
                     DTensor::from_local(at::ones({2}, at::kDouble).to(c10::kMeta), mesh,
                                         {Partial{}})
                         .full_tensor();
                   },
                   options),
               "but this world's backend is store, which moves CPU tensors only");
}

}  // namespace
}  // namespace te
