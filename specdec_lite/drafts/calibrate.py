"""python -m specdec_lite.drafts.calibrate: measure this machine's dynamic-tree costs for a target's EAGLE head and
keep them, so "auto" and the dynamic trees size their trees for this machine (``drafts.loading.calibrate``). Until
then the head's shipped defaults for the kind of device serve, and every run drafts the same trees. Run it alone on
a quiet machine (about a minute for the embedded target on a 2-core CPU); ``make calibrate`` runs it."""
import argparse

from ..tuning.devices import DTYPE_HELP
from ..names import EMBEDDED_TARGET
from ..core.models import load_model
from .loading import calibrate


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", default=EMBEDDED_TARGET, help="package name, Hugging Face id or local folder")
    parser.add_argument("--head", default=None, help="the EAGLE head's name under the drafts folder (default: the "
                        "recommended one)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto", help=DTYPE_HELP)
    parser.add_argument("--int4", action="store_true", help="the embedded target on its 4-bit blocks (load_model(..., "
                        "int4=True)), a kind of device of its own")
    parser.add_argument("--compile", action="store_true", help="the target compiled on a request-sized static cache "
                        "(load_model(..., cache='static', compile=True)), a kind of device of its own")
    parser.add_argument("--ship", action="store_true", help="also write the costs into the head's folder as the "
                        "shipped defaults for this kind of device (maintainers)")
    args = parser.parse_args(argv)
    compiled = dict(cache="static", compile=True) if args.compile else {}
    target, _ = load_model(args.target, args.device, args.dtype, int4=args.int4, **compiled)
    try:
        costs = calibrate(target, args.head, ship=args.ship)
    except (RuntimeError, ValueError) as err:
        parser.exit(1, f"calibrate: {err}\n")
    v = ", ".join(f"v({n}) {x:.2f}" for n, x in sorted(costs["v"].items()))
    print(f"kept: {costs['file']}\n{v}; head cost per depth {costs['head_cost']:.3f} decode steps; decode step "
          f"{costs['target_step_seconds'] * 1000:.1f} ms")


if __name__ == "__main__":
    main()
