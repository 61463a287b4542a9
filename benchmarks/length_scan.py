"""How far can the one unpublished input, the mean response length, move a set of rows?

Sets ``avg_gen_len`` of every selected row (all rows whose case_id starts with ``--prefix``)
to each value of a grid, predicts them with the model as shipped, and prints the errors and
the smallest achievable max error over the grid. Use it to tell a model gap from a data gap:
if no single length brings every row of one recipe within the target, the rows disagree with
each other, not with the model (docs/validation.md, "What remains").

    python benchmarks/length_scan.py --prefix verl-fa-7b          # the shipped data set
    python benchmarks/length_scan.py other.csv --prefix verl-fa-7b
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", nargs="?", default=None, help="default: the shipped data set")
    ap.add_argument("--prefix", required=True, help="case_id prefix selecting the rows")
    ap.add_argument("--lo", type=float, default=400.0, help="smallest mean length (tokens)")
    ap.add_argument("--hi", type=float, default=2000.0, help="largest mean length (tokens)")
    ap.add_argument("--step", type=float, default=50.0)
    a = ap.parse_args(argv)
    from rpeg.perf.validation.published import read_rows, validate_rows

    rows = [r for r in read_rows(a.csv) if r.get("case_id", "").startswith(a.prefix)]
    if not rows:
        print(f"no rows with case_id prefix {a.prefix!r}", file=sys.stderr)
        return 2
    best: tuple[float, float] | None = None
    mean = a.lo
    while mean <= a.hi + 1e-9:
        rep = validate_rows([dict(r, avg_gen_len=str(mean)) for r in rows], intervals=False)
        if not rep.compared:
            print(f"mean={mean:.0f}: no row predicted", file=sys.stderr)
            return 1
        worst = max(abs(r.error) for r in rep.compared) * 100
        errs = " ".join(f"{r.case_id[len(a.prefix) :]}:{100 * r.error:+.0f}%" for r in rep.compared)
        print(f"mean={mean:6.0f}  max={worst:5.1f}%  {errs}")
        if best is None or worst < best[1]:
            best = (mean, worst)
        mean += a.step
    assert best is not None
    print(
        f"SUMMARY rows={len(rows)} prefix={a.prefix} best_max={best[1]:.1f}% "
        f"at mean_response_tokens={best[0]:.0f} (grid {a.lo:.0f}-{a.hi:.0f} step {a.step:.0f})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
