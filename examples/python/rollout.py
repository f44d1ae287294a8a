"""A rollout process: joins the job trainer.py runs, receives each version tensor by tensor, and
checks it against the model the trainer holds at that step. See trainer.py for how to start both."""
import argparse
import os

import torch

import ferry
from trainer import SECRET, make_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--coordinator", required=True, help="the address trainer.py prints")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--versions", type=int, default=3)
    args = parser.parse_args()

    expected = make_model()
    with ferry.Rollout(coordinator=args.coordinator, instance=0, rank=args.rank, secret=SECRET) as rollout:
        rollout.join()  # nothing registered: ferry holds the trainer's table and streams it
        for version in range(1, args.versions + 1):
            with torch.no_grad():
                for parameter in expected.parameters():
                    parameter.add_(1.0)
            want = dict(expected.named_parameters())
            for name, tensor in rollout.receive(version, timeout=60):  # each tensor as it completes
                if not torch.equal(tensor, want.pop(name)):
                    raise SystemExit(f"rollout {args.rank}: '{name}' of version {version} differs")
            if want:
                raise SystemExit(f"rollout {args.rank}: version {version} lacked {sorted(want)}")
            print(f"rollout {args.rank}: version {version} verified", flush=True)


if __name__ == "__main__":
    main()
