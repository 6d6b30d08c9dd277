"""The tampering table: every trick of tests/test_tampering.py in both task layouts, with the
reward it earns, whether it was flagged, and the grading time; then the honest oracle and no-op.

    python bench/bench_tampering.py [--repeats 3]
"""
import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
import env as E  # noqa: E402
from test_tampering import TRICKS, UNUSED, make_task, play  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3, help="honest episodes per layout (grading time)")
    args = ap.parse_args()
    rows, times = [], []
    with tempfile.TemporaryDirectory() as tmp, E.Env(warm=1) as env:
        tasks = {layout: make_task(Path(tmp), layout) for layout in ("tb1", "tb2")}
        for name, cmd in [("(oracle)", None), ("(no-op)", "true")] * args.repeats + list(TRICKS.items()) + list(UNUSED.items()):
            for layout, task in tasks.items():
                g, dt = play(env, task, cmd)
                if cmd is None or cmd == "true":
                    times.append(dt)
                if name.startswith("(") and (name, layout) in {(r[0], r[1]) for r in rows}:
                    continue
                flag = getattr(g, "tampered", None)
                rows.append((name, layout, "infra error" if g.infra_error else f"{g.reward:g}",
                             "yes" if flag else "no", dt, (flag or g.infra_error or "")[:70]))
    print(f"\n{'trick':<50} {'layout':<6} {'reward':<11} {'flagged':<7} {'grade s':>7}  evidence")
    for name, layout, reward, flag, dt, why in rows:
        print(f"{name:<50} {layout:<6} {reward:<11} {flag:<7} {dt:>7.2f}  {why}")
    print(f"\nhonest episodes' grading time: median {statistics.median(times) * 1e3:.0f} ms over {len(times)}")


if __name__ == "__main__":
    main()
