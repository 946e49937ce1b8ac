// A reference to a callable, as C++26's std::function_ref (internal).
//
// A function that takes a caller's lambda as a template parameter is compiled once per lambda:
// the backends' waits (Waiter::wait with the backend's site) came to about 0.1 MB of machine code
// each, ten of them, and most of the whole-library link-time optimization's time. Taking a
// FunctionRef makes them one. It neither owns nor copies the callable, which must outlive it (a
// parameter's lambda does); calling it costs one indirect call.
#pragma once

#include <memory>
#include <type_traits>
#include <utility>

namespace lockstep::detail {

template <class Signature>
class FunctionRef;

template <class R, class... Args>
class FunctionRef<R(Args...)> {
 public:
  template <class F>
  requires(!std::is_same_v<std::remove_cvref_t<F>, FunctionRef> &&
           std::is_invocable_r_v<R, F&, Args...>)
      // NOLINTNEXTLINE(google-explicit-constructor, bugprone-forwarding-reference-overload)
      FunctionRef(F&& callable)
  noexcept
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(callable)))),
        call_([](void* object, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(object))(std::forward<Args>(args)...);
        }) {}

  R operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }

 private:
  void* object_;
  R (*call_)(void*, Args...);
};

}  // namespace lockstep::detail
