// io_queue: the bounded queue and completion tickets behind the storage backends.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "hybridcache/tiered/io_queue.hpp"

using namespace hybridcache;
using namespace hybridcache::tiered;

namespace {

/// A job that blocks until the test opens the gate, then reports its value as bytes.
struct gated_job {
  int value = 0;
};

struct gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  void release() {
    {
      std::lock_guard l(mu);
      open = true;
    }
    cv.notify_all();
  }
  void pass() {
    std::unique_lock l(mu);
    cv.wait(l, [&] { return open; });
  }
};

}  // namespace

TEST_CASE("io_queue: tickets, wait_for, poll, busy when full, stale after use") {
  gate g;
  io_queue<gated_job> q(3, 2, [&](gated_job& j, std::size_t) {
    g.pass();
    return io_result{io_status::ok, j.value, {}};
  });
  const auto a = q.submit({1}), b = q.submit({2}), c = q.submit({3});
  REQUIRE(a);
  REQUIRE(b);
  REQUIRE(c);
  const auto full = q.submit({4});
  REQUIRE_FALSE(full);
  CHECK(full.error() == errc::busy);
  CHECK(q.complete_now({io_status::ok, 0, {}}).error() == errc::busy);
  CHECK(q.in_use() == 3);
  CHECK_FALSE(q.poll(*a).value());
  const auto timed_out = q.wait_for(*a, std::chrono::milliseconds(20));
  REQUIRE(timed_out);
  CHECK(timed_out->status == io_status::pending);  // the ticket stays live
  g.release();
  CHECK(q.wait(*c)->bytes == 3);
  CHECK(q.wait(*a)->bytes == 1);
  const auto rb = q.wait_for(*b, std::chrono::seconds(10));
  REQUIRE(rb);
  CHECK(rb->bytes == 2);
  CHECK(q.in_use() == 0);
  // Each ticket is consumed once; a reused slot's new ticket does not accept the old one.
  CHECK(q.wait(*a).error() == errc::stale_handle);
  CHECK(q.poll(*b).error() == errc::stale_handle);
  const auto d = q.submit({5});
  REQUIRE(d);
  CHECK(q.wait(*d)->bytes == 5);
  for (const io_ticket& old : {*a, *b, *c}) CHECK(q.wait_for(old, std::chrono::milliseconds(1)).error() == errc::stale_handle);
  CHECK(q.wait(io_ticket{}).error() == errc::stale_handle);
  CHECK(q.wait(io_ticket{77, 1}).error() == errc::stale_handle);
  const auto now = q.complete_now({io_status::not_found, 0, {}});
  REQUIRE(now);
  CHECK(q.poll(*now).value());
  CHECK(q.wait(*now)->status == io_status::not_found);
}

TEST_CASE("io_queue: a handler that throws ends its job unavailable; shutdown runs what is queued") {
  std::atomic<int> ran{0};
  auto q = std::make_unique<io_queue<gated_job>>(8, 1, [&](gated_job& j, std::size_t) {
    ++ran;
    if (j.value < 0) throw std::runtime_error("boom");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return io_result{io_status::ok, j.value, {}};
  });
  const auto bad = q->submit({-1});
  REQUIRE(bad);
  CHECK(q->wait(*bad)->status == io_status::unavailable);
  for (int i = 0; i < 6; ++i) REQUIRE(q->submit({i}));
  q->shutdown();  // runs the six queued jobs first
  CHECK(ran.load() == 7);
  CHECK(q->submit({9}).error() == errc::busy);
  CHECK_THROWS_AS(io_queue<gated_job>(0, 1, [](gated_job&, std::size_t) { return io_result{}; }), invalid_argument);
  CHECK_THROWS_AS(io_queue<gated_job>(4, 0, [](gated_job&, std::size_t) { return io_result{}; }), invalid_argument);
}
