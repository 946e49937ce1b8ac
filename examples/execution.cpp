// Accelerate's "execution process" guide, as one lockstep program.
//
//   lockstep-run --nproc-per-node 4 ./examples/lockstep-example [result-file]
//
// Every process does a share of the work; the local main process draws the progress bar; some
// messages print once per machine and once overall. Given a result file, every process writes
// its share beside it, and the main process gathers the shares into it after everyone has
// finished (without one, nothing is written).
#include <lockstep/lockstep.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

namespace {

constexpr int kSteps = 20;

// A stand-in for a training step: this process's share of the work.
long long work(int process, int step) {
  std::this_thread::sleep_for(std::chrono::milliseconds(5 + process));
  return static_cast<long long>(process + 1) * (step + 1);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string result_path = argc > 1 ? argv[1] : "";
  lockstep::State state;

  // Once overall, and once per machine.
  state.on_main_process([&] {
    std::cout << "job of " << state.num_processes() << " processes on " << state.num_nodes()
              << " machine(s)" << std::endl;
  })();
  state.on_local_main_process([&] {
    std::cout << "machine " << state.node_index() << " runs " << state.num_local_processes()
              << " processes" << std::endl;
  })();

  // The main process prepares something (say, a dataset) before the others read it.
  {
    auto guard = state.main_process_first();
    state.on_main_process(
        [] { std::cout << "main process prepares the data first" << std::endl; })();
  }

  // Every process works; only the local main process draws the progress bar.
  long long total = 0;
  auto draw = state.on_local_main_process([](int step) {
    auto filled = static_cast<std::size_t>((step + 1) * 30 / kSteps);
    std::cout << "\r[" << std::string(filled, '#') << std::string(30 - filled, ' ') << "] "
              << step + 1 << "/" << kSteps << std::flush;
  });
  for (int step = 0; step < kSteps; ++step) {
    total += work(state.process_index(), step);
    draw(step);
  }
  state.on_local_main_process([] { std::cout << std::endl; })();
  state.wait_for_everyone();

  // Functions that run on one process only; a value comes back as std::optional.
  auto greeting = state.on_process(0, [](int n) { return "process 0 of " + std::to_string(n); });
  if (auto text = greeting(state.num_processes())) {
    std::cout << "only " << *text << " runs this" << std::endl;
  }
  state.on_local_process(0, [&] {
    std::cout << "local process 0 of machine " << state.node_index() << " runs this" << std::endl;
  })();
  state.on_last_process([&] {
    std::cout << "the last process (" << state.process_index() << ") says goodbye" << std::endl;
  })();

  if (result_path.empty()) {
    state.on_main_process([] {
      std::cout << "(give a result file to gather every process's share into it)" << std::endl;
    })();
    return 0;
  }
  // Everyone finishes before the main process writes the result.
  std::ofstream(result_path + ".part" + std::to_string(state.process_index())) << total << "\n";
  state.wait_for_everyone();
  state.on_main_process([&] {
    long long sum = 0;
    for (int process = 0; process < state.num_processes(); ++process) {
      std::string part = result_path + ".part" + std::to_string(process);
      long long value = 0;
      std::ifstream(part) >> value;
      sum += value;
      std::filesystem::remove(part);
    }
    std::ofstream(result_path) << "processes " << state.num_processes() << "\nsum " << sum << "\n";
    std::cout << "main process wrote " << result_path << " (sum " << sum << ")" << std::endl;
  })();
  return 0;
}
