#!/usr/bin/env python3
"""Prints `ferry chaos --footprint --json`'s verdict (one JSON object on stdin) as a markdown table.

Usage: ferry chaos ... --footprint --json | footprint_table.py"""
import json
import sys

r = json.loads(sys.stdin.readline())
f = r.get("footprint", {})
print(f"verified {r['verified']}, {r['versions']} versions, {r['kills']} kills, {r['regroups']} regroups, "
      f"regroup median {r['regroup_ms_median']:.1f} ms, worst {r['regroup_ms_max']:.1f} ms"
      + (f", error: {r['error']}" if "error" in r else ""))
print("| process | RSS KiB first | last | open files first | last |")
print("| --- | --- | --- | --- | --- |")
for p in f.get("processes", []):
    print(f"| {p['process']} | {p['rss_kib'][0]} | {p['rss_kib'][1]} | {p['fds'][0]} | {p['fds'][1]} |")
print(f"largest growth: RSS {100 * f.get('rss_growth_max', 0):.2f}%, open files {100 * f.get('fds_growth_max', 0):.2f}%")
