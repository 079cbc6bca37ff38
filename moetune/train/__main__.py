"""python -m moetune.train RECIPE.yaml [--out DIR] [--card-only] [--stage all|mtp]"""
import argparse
import json
import os
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m moetune.train")
    ap.add_argument("recipe", type=Path)
    ap.add_argument("--out", type=Path, default=None, help="write everything under DIR instead")
    ap.add_argument("--card-only", action="store_true", help="regenerate README.md from metrics.json")
    ap.add_argument("--stage", choices=("all", "mtp"), default="all",
                    help="mtp: only train the MTP head of the model already in the output dir (target frozen)")
    a = ap.parse_args()
    # Sleep instead of spinning in OpenMP barriers: a shared 2-core machine is much faster so.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from .run import load_recipe, output_paths, run_recipe

    if a.card_only:
        from .card import write_card

        r = load_recipe(a.recipe)
        model_dir = output_paths(r, a.out)["model"]
        write_card(model_dir, r, json.loads((model_dir / "metrics.json").read_text()))
        return
    if a.stage == "mtp":
        from .card import write_card
        from .mtp import run_and_record

        r = load_recipe(a.recipe)
        paths = output_paths(r, a.out)
        write_card(paths["model"], r, run_and_record(r, paths["model"], paths["prompts"]))
        return
    run_recipe(a.recipe, a.out)


if __name__ == "__main__":
    main()
