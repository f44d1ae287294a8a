"""A trainer process: runs the job's coordinator, publishes a small torch model after each
"training step", and waits until every rollout process holds it.

    python3 trainer.py --rollouts 2 --versions 3     # prints the address the rollouts join
    python3 rollout.py --coordinator tcp://127.0.0.1:PORT --rank 0 --versions 3
    python3 rollout.py --coordinator tcp://127.0.0.1:PORT --rank 1 --versions 3

The job secret comes from FERRY_SECRET (a demonstration one when unset, here and in rollout.py).
"""
import argparse
import os

import torch

import ferry

SECRET = os.environ.setdefault("FERRY_SECRET", "an-example-secret-of-enough-bytes")


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(1000, 64), torch.nn.Linear(64, 256), torch.nn.Linear(256, 1000))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=2, help="rollout processes (one instance of this many)")
    parser.add_argument("--versions", type=int, default=3)
    parser.add_argument("--listen", default="tcp://127.0.0.1:0")
    parser.add_argument("--address-file", help="also write the coordinator's address here")
    args = parser.parse_args()

    coordinator = ferry.Coordinator(listen=args.listen, trainers=1, instance_sizes=[args.rollouts],
                                    chunk_bytes=1 << 20, secret=SECRET)
    print(f"coordinator: {coordinator.address}", flush=True)
    if args.address_file:
        with open(args.address_file + ".tmp", "w") as f:
            f.write(coordinator.address)
        os.rename(args.address_file + ".tmp", args.address_file)

    model = make_model()
    with ferry.Trainer(coordinator=coordinator.address, secret=SECRET) as trainer:
        for name, parameter in model.named_parameters():
            trainer.register(name, parameter)  # ferry reads the parameters in place
        trainer.join()
        for version in range(1, args.versions + 1):
            with torch.no_grad():  # the "training step"
                for parameter in model.parameters():
                    parameter.add_(1.0)
            update = trainer.publish(version)
            update.wait_offloaded(timeout=60)  # the next step may write the parameters from here
            update.wait_delivered(timeout=60)
            print(f"trainer: version {version} delivered to {args.rollouts} rollouts", flush=True)
    coordinator.close()


if __name__ == "__main__":
    main()
