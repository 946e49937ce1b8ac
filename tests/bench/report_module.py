"""What the checks of tools/bench-report share: the tool loaded as a module, and the failure."""
import importlib.machinery
import importlib.util
import os
import sys


def load_bench_report(root):
    """tools/bench-report of the source tree `root`, as a module (it has no .py name)."""
    loader = importlib.machinery.SourceFileLoader("bench_report",
                                                  os.path.join(root, "tools", "bench-report"))
    spec = importlib.util.spec_from_loader("bench_report", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def fail(message):
    sys.exit(f"FAIL: {message}")
