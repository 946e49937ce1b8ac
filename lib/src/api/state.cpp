#include "lockstep/state.hpp"

#include <algorithm>
#include <exception>
#include <string>

#include "gpu/devices.hpp"
#include "membership/context.hpp"

namespace lockstep {
namespace {

detail::CallSite site_of(const SourceLocation& where) noexcept {
  return {where.file_name(), where.function_name(), where.line()};
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

State::State(SourceLocation where) : State(site_of(where)) {}
State::State(const detail::CallSite& site) : context_(detail::Context::instance(site)) {}
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
  wait_at(std::nullopt, site_of(where));
}

void State::wait_for_everyone(std::chrono::milliseconds timeout, SourceLocation where) {
  wait_at(timeout, site_of(where));
}

void State::wait_at(std::optional<std::chrono::milliseconds> timeout,
                    const detail::CallSite& site) {
  if (!timeout) {
    context_->wait(std::nullopt, "wait_for_everyone", detail::CallKind::wait, site);
    return;
  }
  std::string what = "wait_for_everyone(" + std::to_string(timeout->count()) + " ms)";
  if (timeout->count() < 0) {
    throw ConfigError("lockstep: " + what + ": the timeout is negative (0 means: fail at once " +
                      "unless everyone has arrived)");
  }
  context_->wait(timeout, what.c_str(), detail::CallKind::wait, site);
}

bool State::try_wait_for_everyone(SourceLocation where) {
  return try_wait_at(site_of(where));
}

bool State::try_wait_at(const detail::CallSite& site) {
  // Named as the wait it tries: what fails is the barrier the others meet in as
  // wait_for_everyone, and Python's wait_for_everyone() makes this call first.
  return context_->try_wait("wait_for_everyone", site);
}

std::vector<std::byte> State::broadcast(std::span<const std::byte> data, SourceLocation where) {
  return broadcast_at(data, site_of(where));
}

std::vector<std::byte> State::broadcast_at(std::span<const std::byte> data,
                                           const detail::CallSite& site) {
  return context_->broadcast(data, "broadcast", site);
}

std::string State::broadcast(std::string_view text, SourceLocation where) {
  const auto bytes =
      broadcast_at(std::as_bytes(std::span(text.data(), text.size())), site_of(where));
  std::string out(bytes.size(), '\0');
  std::transform(bytes.begin(), bytes.end(), out.begin(),
                 [](std::byte b) { return static_cast<char>(b); });
  return out;
}

std::vector<std::vector<std::byte>> State::gather_object(std::span<const std::byte> data,
                                                         SourceLocation where) {
  return gather_at(data, site_of(where));
}

std::vector<std::vector<std::byte>> State::gather_at(std::span<const std::byte> data,
                                                     const detail::CallSite& site) {
  return context_->gather(data, "gather_object", site);
}

std::vector<std::string> State::gather_object(std::string_view text, SourceLocation where) {
  const auto all = gather_at(std::as_bytes(std::span(text.data(), text.size())), site_of(where));
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
  return check_trigger_at(site_of(where));
}

bool State::check_trigger_at(const detail::CallSite& site) {
  return context_->check_trigger("check_trigger", site);
}

void State::wait_for_everyone(CUstream_st* stream, SourceLocation where) {
  wait_stream_at(stream, std::nullopt, site_of(where));
}

void State::wait_for_everyone(CUstream_st* stream, std::chrono::milliseconds timeout,
                              SourceLocation where) {
  wait_stream_at(stream, timeout, site_of(where));
}

void State::wait_stream_at(CUstream_st* stream, std::optional<std::chrono::milliseconds> timeout,
                           const detail::CallSite& site) {
  if (!timeout) {
    context_->wait_stream(stream, std::nullopt, "wait_for_everyone(stream)", site);
    return;
  }
  std::string what = "wait_for_everyone(stream, " + std::to_string(timeout->count()) + " ms)";
  if (timeout->count() < 0) {
    throw ConfigError("lockstep: " + what + ": the timeout is negative");
  }
  context_->wait_stream(stream, timeout, what.c_str(), site);
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
  return first_at(false, site_of(where));
}

FirstGuard State::local_main_process_first(SourceLocation where) {
  return first_at(true, site_of(where));
}

FirstGuard State::first_at(bool local, const detail::CallSite& site) {
  return {context_, local ? is_local_main_process() : is_main_process(), local, site};
}

FirstGuard::FirstGuard(std::shared_ptr<detail::Context> context, bool first, bool local,
                       const detail::CallSite& site)
    : context_(std::move(context)),
      first_(first),
      local_(local),
      uncaught_at_entry_(std::uncaught_exceptions()),
      file_(site.file),
      function_(site.function),
      line_(site.line) {
  if (!first_) {
    context_->wait(std::nullopt, "main_process_first (waiting for the first process)",
                   local_ ? detail::CallKind::local_first_wait : detail::CallKind::first_wait,
                   site);
  } else {
    // The first process enters its block only if the job can still release the others.
    context_->check_intact("main_process_first");
  }
}

FirstGuard::FirstGuard(FirstGuard&& other) noexcept
    : context_(std::move(other.context_)),
      first_(other.first_),
      local_(other.local_),
      uncaught_at_entry_(other.uncaught_at_entry_),
      file_(other.file_),
      function_(other.function_),
      line_(other.line_) {}

void FirstGuard::release() {
  context_->wait(std::nullopt, "main_process_first (releasing the others)",
                 local_ ? detail::CallKind::local_first_release : detail::CallKind::first_release,
                 detail::CallSite{file_, function_, line_});
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
