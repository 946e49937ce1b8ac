#include "lockstep/state.hpp"

#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>
#include <string>

#include "engine/spill.hpp"  // prefault
#include "gpu/devices.hpp"
#include "membership/context.hpp"

namespace lockstep {
namespace {

// wait_for_everyone, untimed or timed (State's rule for the timeout).
void wait_in(detail::Context& context, std::optional<std::chrono::milliseconds> timeout,
             SourceLocation where) {
  if (!timeout) {
    context.wait(std::nullopt, "wait_for_everyone", detail::CallKind::wait, where);
    return;
  }
  std::string what = "wait_for_everyone(" + std::to_string(timeout->count()) + " ms)";
  if (timeout->count() < 0) {
    throw ConfigError("lockstep: " + what + ": the timeout is negative (0 means: fail at once " +
                      "unless everyone has arrived)");
  }
  context.wait(timeout, what.c_str(), detail::CallKind::wait, where);
}

// wait_for_everyone(stream), untimed or timed.
void wait_stream_in(detail::Context& context, CUstream_st* stream,
                    std::optional<std::chrono::milliseconds> timeout, SourceLocation where) {
  if (!timeout) {
    context.wait_stream(stream, std::nullopt, "wait_for_everyone(stream)", where);
    return;
  }
  std::string what = "wait_for_everyone(stream, " + std::to_string(timeout->count()) + " ms)";
  if (timeout->count() < 0) {
    throw ConfigError("lockstep: " + what + ": the timeout is negative");
  }
  context.wait_stream(stream, timeout, what.c_str(), where);
}

// The bytes of a copy made once: straight into `room`'s memory.
void copy_to(std::byte* to, std::span<const std::byte> bytes) noexcept {
  if (!bytes.empty()) {
    std::memcpy(to, bytes.data(), bytes.size());
  }
}

}  // namespace

std::vector<std::string> available_backends() {
  return detail::built_backends();
}

Share split_range(std::size_t size, int num_processes, int process_index) {
  if (num_processes < 1 || process_index < 0 || process_index >= num_processes) {
    throw ConfigError("lockstep: split_range: no process " + std::to_string(process_index) +
                      " among " + std::to_string(num_processes));
  }
  const auto n = static_cast<std::size_t>(num_processes);
  const auto i = static_cast<std::size_t>(process_index);
  const std::size_t base = size / n;
  const std::size_t extra = size % n;
  Share share;
  share.begin = i * base + std::min(i, extra);
  share.end = share.begin + base + (i < extra ? 1 : 0);
  // The longest share is ceil(size / n), written so that it cannot overflow near 2^64.
  share.padding = size == 0 ? 0 : base + (extra != 0 ? 1 : 0) - share.size();
  return share;
}

State::State(SourceLocation where) : context_(detail::Context::instance(where)) {}
State::~State() = default;

int State::process_index() const noexcept {
  return context_->config().rank;
}
int State::local_process_index() const noexcept {
  return context_->local_index();
}
int State::num_processes() const noexcept {
  return context_->config().world_size;
}
int State::num_local_processes() const noexcept {
  return context_->config().local_size;
}
int State::node_index() const noexcept {
  return context_->config().node_index;
}
int State::num_nodes() const noexcept {
  return context_->config().num_nodes;
}
WaitPolicy State::wait_policy() const noexcept {
  return context_->config().wait_policy;
}
std::string State::environment_source() const {
  return context_->config().source;
}

void State::wait_for_everyone(SourceLocation where) {
  wait_in(*context_, std::nullopt, where);
}

void State::wait_for_everyone(std::chrono::milliseconds timeout, SourceLocation where) {
  wait_in(*context_, timeout, where);
}

bool State::try_wait_for_everyone(SourceLocation where) {
  // Named as the wait it tries: what fails is the barrier the others meet in as
  // wait_for_everyone, and Python's wait_for_everyone() makes this call first.
  return context_->try_wait("wait_for_everyone", where);
}

std::vector<std::byte> State::broadcast(std::span<const std::byte> data, SourceLocation where) {
  return context_->broadcast(data, "broadcast", where);
}

void State::broadcast_into(std::span<const std::byte> data,
                           const std::function<std::byte*(std::size_t)>& room,
                           SourceLocation where) {
  context_->broadcast_into(
      data, [&](std::span<const std::byte> bytes) { copy_to(room(bytes.size()), bytes); },
      "broadcast", where);
}

std::string State::broadcast(std::string_view text, SourceLocation where) {
  const auto bytes = broadcast(std::as_bytes(std::span(text.data(), text.size())), where);
  std::string out(bytes.size(), '\0');
  std::transform(bytes.begin(), bytes.end(), out.begin(),
                 [](std::byte b) { return static_cast<char>(b); });
  return out;
}

std::vector<std::vector<std::byte>> State::gather_object(std::span<const std::byte> data,
                                                         SourceLocation where) {
  return context_->gather(data, "gather_object", where);
}

void State::gather_object_into(std::span<const std::byte> data,
                               const std::function<std::byte*(std::span<const std::size_t>)>& room,
                               SourceLocation where) {
  std::vector<std::size_t> offsets;
  std::byte* base = nullptr;
  context_->gather_into(data,
                        {[&](const std::vector<std::uint64_t>& sizes) {
                           const std::vector<std::size_t> each(sizes.begin(), sizes.end());
                           std::size_t total = 0;
                           for (const std::size_t size : each) {
                             offsets.push_back(total);
                             total += size;
                           }
                           base = room(each);
                         },
                         [&](int rank, std::span<const std::byte> bytes) {
                           copy_to(base + offsets[static_cast<std::size_t>(rank)], bytes);
                         },
                         [&](int rank) { return base + offsets[static_cast<std::size_t>(rank)]; }},
                        "gather_object", where);
}

void State::broadcast_in_place(std::span<const std::byte> data,
                               const std::function<void(std::span<const std::byte>)>& each,
                               SourceLocation where) {
  context_->broadcast_into(data, each, "broadcast", where);
}

void State::gather_object_in_place(std::span<const std::byte> data,
                                   const std::function<void(int, std::span<const std::byte>)>& each,
                                   SourceLocation where) {
  // A process whose bytes stay in its memory (small ones, or a process that called
  // gather_object) is read into a copy, given to `each` once the exchange is over; a copy that
  // could not be read is dropped when `put` gives its bytes, from the writer's spill, meanwhile.
  std::vector<std::uint64_t> sizes;
  std::vector<std::unique_ptr<std::byte[]>> copies;  // NOLINT(*-avoid-c-arrays): not zeroed
  context_->gather_into(data,
                        {[&](const std::vector<std::uint64_t>& of) {
                           sizes = of;
                           copies.resize(of.size());
                         },
                         [&](int rank, std::span<const std::byte> bytes) {
                           copies[static_cast<std::size_t>(rank)].reset();
                           each(rank, bytes);
                         },
                         [&](int rank) {
                           const auto at = static_cast<std::size_t>(rank);
                           copies[at] = std::make_unique_for_overwrite<std::byte[]>(sizes[at]);
                           detail::prefault(copies[at].get(), sizes[at]);
                           return copies[at].get();
                         },
                         true},
                        "gather_object", where);
  for (std::size_t rank = 0; rank < copies.size(); ++rank) {
    if (copies[rank]) {
      each(static_cast<int>(rank), std::span(copies[rank].get(), sizes[rank]));
    }
  }
}

std::vector<std::string> State::gather_object(std::string_view text, SourceLocation where) {
  const auto all = gather_object(std::as_bytes(std::span(text.data(), text.size())), where);
  std::vector<std::string> out;
  out.reserve(all.size());
  for (const auto& bytes : all) {
    out.emplace_back(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
  return out;
}

void State::set_trigger() noexcept {
  context_->set_trigger();
}

bool State::check_trigger(SourceLocation where) {
  return context_->check_trigger("check_trigger", where);
}

void State::wait_for_everyone(CUstream_st* stream, SourceLocation where) {
  wait_stream_in(*context_, stream, std::nullopt, where);
}

void State::wait_for_everyone(CUstream_st* stream, std::chrono::milliseconds timeout,
                              SourceLocation where) {
  wait_stream_in(*context_, stream, timeout, where);
}

bool State::gpu_barrier_released() const noexcept {
  return context_->stream_released();
}

const volatile std::uint32_t* State::gpu_release_word() const noexcept {
  return context_->stream_release_word();
}

void State::leave() {
  context_->leave_on_purpose("leave");
}

int State::device() const {
  return detail::visible_device(context_->local_index());
}

void State::check_index(const char* what, int index) {
  if (index < 0) {
    throw ConfigError(std::string("lockstep: ") + what + ": process index " +
                      std::to_string(index) + " is negative");
  }
}

FirstGuard State::main_process_first(SourceLocation where) {
  return {context_, is_main_process(), false, where};
}

FirstGuard State::local_main_process_first(SourceLocation where) {
  return {context_, is_local_main_process(), true, where};
}

FirstGuard::FirstGuard(std::shared_ptr<detail::Context> context, bool first, bool local,
                       SourceLocation where)
    : context_(std::move(context)),
      first_(first),
      local_(local),
      uncaught_at_entry_(std::uncaught_exceptions()) {
  if (!first_) {
    context_->wait(std::nullopt, "main_process_first (waiting for the first process)",
                   local_ ? detail::CallKind::local_first_wait : detail::CallKind::first_wait,
                   where);
  } else {
    // The first process enters its block only if the job can still release the others.
    context_->check_intact("main_process_first");
    keep(where);
  }
}

void FirstGuard::keep(SourceLocation where) {
  where_known_ = where.file_name() != nullptr;
  where_file_ = where_known_ ? where.file_name() : "";
  where_function_ = where.function_name() != nullptr ? where.function_name() : "";
  where_line_ = where.line();
}

FirstGuard::FirstGuard(FirstGuard&& other) noexcept
    : context_(std::move(other.context_)),
      first_(other.first_),
      local_(other.local_),
      uncaught_at_entry_(other.uncaught_at_entry_),
      where_known_(other.where_known_),
      where_file_(std::move(other.where_file_)),
      where_function_(std::move(other.where_function_)),
      where_line_(other.where_line_) {}

void FirstGuard::release() {
  context_->wait(std::nullopt, "main_process_first (releasing the others)",
                 local_ ? detail::CallKind::local_first_release : detail::CallKind::first_release,
                 where_known_
                     ? SourceLocation(where_file_.c_str(), where_line_, where_function_.c_str())
                     : SourceLocation());
}

void FirstGuard::end() {
  if (context_ && first_) {
    try {
      release();
    } catch (const InterruptedError&) {
      throw;  // the others are still held: end() may be called again
    } catch (...) {
      context_.reset();
      throw;
    }
  }
  context_.reset();
}

void FirstGuard::end(SourceLocation where) {
  if (context_ && first_) {
    keep(where);
  }
  end();
}

FirstGuard::~FirstGuard() {
  if (!context_ || !first_ || std::uncaught_exceptions() > uncaught_at_entry_) {
    return;
  }
  try {
    release();
  } catch (...) {
    context_->defer(std::current_exception());
  }
}

}  // namespace lockstep
