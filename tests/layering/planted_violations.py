#!/usr/bin/env python3
"""scripts/check_layers.py must fail on a copy of this tree with planted violations, naming each:
a wrong include (runtime/ including a transport), a real clock in an actor, a thread in a
collective, and an actor choosing a collective's implementation."""
import pathlib
import shutil
import subprocess
import sys
import tempfile

root = pathlib.Path(sys.argv[1])
script = root / "scripts" / "check_layers.py"
with tempfile.TemporaryDirectory() as tmp:
    copy = pathlib.Path(tmp)
    for folder in ("runtime", "platform", "transport", "collectives", "actors", "protocol", "sim", "jobs", "api", "python", "bench", "cli", "examples"):
        if (root / folder).is_dir():
            shutil.copytree(root / folder, copy / folder, ignore=shutil.ignore_patterns("*.txt", "*.py", "*.md"))
    clean = subprocess.run([sys.executable, script, copy], capture_output=True, text=True)
    if clean.returncode != 0:
        sys.exit(f"the unplanted copy must pass:\n{clean.stdout}{clean.stderr}")
    plants = {
        "runtime/node.hpp": ('#include "transport/tcp/tcp_transport.hpp"\n', "includes transport/tcp/tcp_transport.hpp"),
        "actors/coordinator.cpp": ("static auto t0 = std::chrono::steady_clock::now();\n", "steady_clock"),
        "collectives/host/chain_broadcast.cpp": ("static std::thread helper;\n", "a thread of its own"),
        "actors/rollout_worker.cpp": ('#include "collectives/host/chain_broadcast.hpp"\n', "actors/ sees collectives only"),
        "actors/trainer_shard.cpp": ('#include "protocol/protocol.hpp"\n', "includes protocol/protocol.hpp"),
    }
    for file, (line, _) in plants.items():
        path = copy / file
        path.write_text(path.read_text() + line)
    planted = subprocess.run([sys.executable, script, copy], capture_output=True, text=True)
    print(planted.stdout, end="")
    if planted.returncode != 1:
        sys.exit(f"exit {planted.returncode} with planted violations, expected 1")
    for file, (_, expected) in plants.items():
        if not any(l.startswith(file) and expected in l for l in planted.stdout.splitlines()):
            sys.exit(f"the violation planted in {file} was not reported ({expected!r})")
print("check_layers: every planted violation reported")
