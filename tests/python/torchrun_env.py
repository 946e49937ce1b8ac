"""Runs job_check under torchrun's environment (as torchrun sets it for each worker, without
torchrun): N processes with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
GROUP_WORLD_SIZE, ROLE_*, MASTER_ADDR/PORT and TORCHELASTIC_RUN_ID, and no lockstep variable.

    python3 torchrun_env.py N      (PYTHONPATH: lockstep and tests/python)
"""
import os
import subprocess
import sys
import tempfile
import uuid


def main():
    n = int(sys.argv[1])
    run_id = uuid.uuid4().hex
    with tempfile.TemporaryDirectory() as folder:
        workers = []
        for rank in range(n):
            env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
            env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(n),
                       LOCAL_WORLD_SIZE=str(n), GROUP_RANK="0", GROUP_WORLD_SIZE="1",
                       ROLE_RANK=str(rank), ROLE_WORLD_SIZE=str(n), ROLE_NAME="default",
                       MASTER_ADDR="127.0.0.1", MASTER_PORT="29500",
                       TORCHELASTIC_RUN_ID=run_id, TORCHELASTIC_RESTART_COUNT="0")
            workers.append(subprocess.Popen([sys.executable, "-m", "job_check", folder], env=env))
        codes = []
        for worker in workers:
            try:
                codes.append(worker.wait(timeout=60))
            except subprocess.TimeoutExpired:
                for other in workers:
                    other.kill()
                codes.append("timed out")
        if any(code != 0 for code in codes):
            print(f"torchrun_env: FAILED: exit codes {codes}", file=sys.stderr)
            sys.exit(1)
    print(f"torchrun_env: ok ({n} processes)")


if __name__ == "__main__":
    main()
