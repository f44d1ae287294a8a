#!/usr/bin/env python3
"""Checks ferry's layering (docs/architecture.md): each folder includes only the layers below it,
and actors/ and collectives/ reach time, threads and the OS only through their environment.

  scripts/check_layers.py [ROOT]     exit 0 when clean; else one line per violation, exit 1
"""
import pathlib
import re
import sys

# Folder -> the top folders its files may include from.
LAYERS = {
    "runtime": {"runtime"},
    "platform": {"runtime", "platform"},
    "transport": {"runtime", "platform", "transport"},
    "collectives": {"runtime", "platform", "collectives"},
    "actors": {"runtime", "actors", "collectives"},
    "protocol": {"runtime", "collectives", "actors", "protocol"},
    "sim": {"runtime", "sim"},
    "jobs": {"runtime", "platform", "transport", "collectives", "actors", "protocol", "sim", "jobs"},
    "api": {"runtime", "platform", "transport", "collectives", "actors", "protocol", "api"},
    # The API's loop threads too: ferry_internal_bench drives the actors on them, as the API does.
    "bench": {"runtime", "platform", "transport", "collectives", "actors", "protocol", "sim", "jobs", "api", "bench"},
    "cli": {"runtime", "platform", "transport", "collectives", "actors", "protocol", "sim", "jobs", "api", "bench", "cli"},
    "python": {"python"},  # the module sees only the public API, <ferry/ferry.hpp>
    "examples": {"runtime", "platform", "transport", "collectives", "actors", "protocol", "sim", "jobs", "examples"},
}
# actors/ sees collectives only as the interface and the messages it registers, never an
# implementation: the job that builds the actors chooses that.
ACTORS_MAY_SEE = re.compile(r"collectives/broadcast\.hpp$")
# In actors/ and collectives/, what only the environment may touch.
BANNED = [
    (re.compile(r"\bsteady_clock\b"), "steady_clock (use the environment's clock)"),
    (re.compile(r"\bsystem_clock\b"), "system_clock (use the environment's clock)"),
    (re.compile(r"\bstd::thread\b|\bjthread\b"), "a thread of its own (use the environment's executor or platform)"),
    (re.compile(r"\bworker_pool\b"), "the shared worker pool (use the environment's executor)"),
    (re.compile(r"(?<![\w.>:])kill\s*\("), "kill() (use platform().process_alive)"),
    (re.compile(r"/proc\b"), "/proc (use the environment's platform)"),
    (re.compile(r"\bmmap\s*\(|<sys/mman\.h>"), "mmap (memory comes from runtime/host_buffer or the platform)"),
]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def without_comments(line, in_block):
    """The line with // and /* */ comments removed, and whether a block comment goes on."""
    out, i = "", 0
    while i < len(line):
        if in_block:
            end = line.find("*/", i)
            if end < 0:
                return out, True
            i, in_block = end + 2, False
        elif line.startswith("//", i):
            break
        elif line.startswith("/*", i):
            in_block, i = True, i + 2
        else:
            out += line[i]
            i += 1
    return out, in_block


def check(root):
    problems = []
    for folder, allowed in LAYERS.items():
        for path in sorted((root / folder).rglob("*")):
            if path.suffix not in (".hpp", ".cpp", ".h", ".c"):
                continue
            rel = path.relative_to(root)
            in_block = False
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                m = INCLUDE.match(line)
                if m and "/" in m.group(1):
                    target = m.group(1)
                    top = target.split("/")[0]
                    if top in LAYERS and top not in allowed:
                        problems.append(f"{rel}:{number}: includes {target}: {folder}/ may include only "
                                        f"{', '.join(sorted(allowed))}")
                    elif folder == "actors" and top == "collectives" and not ACTORS_MAY_SEE.match(target):
                        problems.append(f"{rel}:{number}: includes {target}: actors/ sees collectives only through "
                                        "collectives/broadcast.hpp")
                    elif folder == "transport" and top == "transport":
                        own = rel.parts[1] if len(rel.parts) > 2 else None
                        other = target.split("/")[1] if target.count("/") >= 2 else None
                        if own and other and own != other:
                            problems.append(f"{rel}:{number}: includes {target}: one transport never includes another")
                if folder in ("actors", "collectives"):
                    code, in_block = without_comments(line, in_block)
                    for pattern, what in BANNED:
                        if pattern.search(code):
                            problems.append(f"{rel}:{number}: {what}")
    return problems


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)
    missing = [f for f in LAYERS if not (root / f).is_dir() and f != "examples"]
    if missing:
        print(f"check_layers: {root} has no {', '.join(missing)}/: not a ferry tree", file=sys.stderr)
        return 2
    problems = check(root)
    for p in problems:
        print(p)
    print(f"check_layers: {len(problems)} violation(s) in {root}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
