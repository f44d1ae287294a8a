"""What the job checkers share: run a ferry command that prints a JSON verdict on its last line,
check the outcome every job must have (exit 0, verified, every version), and report; and `check`,
for scripts that go on after a failed check and report them all at the end."""
import json
import subprocess
import sys


# What `check` found wrong, in this process.
failures = []


def check(condition, what):
    """Records and prints `what` unless `condition` holds; returns `condition`."""
    if not condition:
        failures.append(what)
        print("FAILED:", what, flush=True)
    return condition


def run_job(command, timeout):
    """Runs `command`; returns (run, verdict, failures), where failures already holds what every
    job must satisfy: a JSON verdict on stdout's last line, exit 0, verified, `--versions` versions."""
    versions = int(command[command.index("--versions") + 1])
    run = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    failures = []
    try:
        verdict = json.loads(run.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError) as e:
        verdict = {}
        failures.append(f"no JSON verdict on stdout's last line ({e})")
    if run.returncode != 0:
        failures.append(f"exit code {run.returncode}")
    if verdict:
        if verdict.get("verified") is not True:
            failures.append(f"not verified: {verdict.get('error', '')}")
        if verdict.get("versions") != versions:
            failures.append(f"versions {verdict.get('versions')} != {versions}")
    return run, verdict, failures


def exit_on_failures(failures, run, stderr_tail):
    """Prints the failures and the command's output, and exits 1, if there are any."""
    if not failures:
        return
    print("FAILED:", "; ".join(failures))
    print("--- stdout ---\n" + run.stdout + "\n--- stderr (tail) ---\n" + run.stderr[-stderr_tail:])
    sys.exit(1)
