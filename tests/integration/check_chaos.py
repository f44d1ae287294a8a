#!/usr/bin/env python3
"""Runs `ferry chaos ... --json` and checks its verdict: exit 0, verified, every version delivered,
rollout processes really killed (leaders among them) and replaced, a regroup for each kill, none
waiting for a timeout. Prints the command's output on failure."""
import sys

from job_verdict import exit_on_failures, run_job

command = sys.argv[1:]
versions = int(command[command.index("--versions") + 1])

run, verdict, failures = run_job(command, timeout=280)
if verdict:
    kills = verdict.get("kills", 0)
    if kills < 2 or verdict.get("leader_kills", 0) < 1:
        failures.append(f"too few kills to mean anything: {kills} ({verdict.get('leader_kills')} leaders)")
    if verdict.get("joins") != kills:
        failures.append(f"joins {verdict.get('joins')} != kills {kills}")
    # A kill is a regroup; a join is one too, unless it merged with another change.
    if verdict.get("regroups", 0) < kills:
        failures.append(f"regroups {verdict.get('regroups')} < kills {kills}")
    # Deaths are seen when a link ends, not at the heartbeat's timeout (10 s) or a stall
    # detector's: every regroup well within either, however loaded the machine.
    if verdict.get("regroup_ms_max", 0) > 2000:
        failures.append(f"a regroup took {verdict['regroup_ms_max']:.0f} ms: a death noticed by a timeout")
    if "--instance-rate" in command and (verdict.get("instance_joins", 0) < 1 or verdict.get("instance_leaves", 0) < 1):
        failures.append(f"no elastic rollout to speak of: {verdict.get('instance_joins')} instances joined, "
                        f"{verdict.get('instance_leaves')} left")

exit_on_failures(failures, run, stderr_tail=8000)
print(f"ok: {versions} versions verified across {verdict['kills']} kills ({verdict['leader_kills']} leaders, "
      f"{verdict['leader_kills_mid_update']} mid-update), {verdict['regroups']} regroups, "
      f"regroup median {verdict['regroup_ms_median']:.1f} ms, worst {verdict['regroup_ms_max']:.1f} ms")
