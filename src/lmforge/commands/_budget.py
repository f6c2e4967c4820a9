"""``lmforge pretrain --budget B`` and ``--plan FILE``: the flags checked against each other, and the plan made
(probed here) or read, as the object :func:`lmforge.train.budget.run_plan` trains."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..errors import ConfigError, LmforgeError
from ..families import get_family
from ..train.budget import BudgetPlan, check_plan_data, holds_model, load_plan, parse_budget, plan_budget
from ..train.pretrain import default_train_config, open_shards
from ._runconfig import compute_flags, is_config_file, model_from_choice, recipe_of, run_file_train, split_sets


def check_budget_args(args: argparse.Namespace) -> None:
    """One-line errors for ``--budget`` / ``--plan`` with clashing options, a bad budget or plan file."""
    if args.search_shape and (args.budget is None or args.config is not None):
        raise LmforgeError("--search-shape chooses the shape of a --budget run among the presets; give --budget "
                           "and drop --config")
    if args.budget is not None and args.plan is not None:
        raise LmforgeError("give --budget (plan a run here) or --plan (replay a saved plan), not both")
    flag = "--budget" if args.budget is not None else "--plan"
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise LmforgeError(f"{flag} plans and replays one-process runs; run it without torchrun")
    for given, name in ((args.resume, "--resume"), (args.max_time is not None, "--max-time"),
                        (args.init, "--init")):
        if given:
            raise LmforgeError(f"{flag} runs a planned number of steps from scratch; drop {name}")
    out = Path(args.out)
    if not args.overwrite and holds_model(out):
        raise LmforgeError(f"{out} already holds a model; a planned run starts afresh: choose another --out "
                           f"(or add --overwrite)")
    if args.plan is not None:
        if args.config is not None or args.overrides:
            raise LmforgeError("--plan replays a plan exactly; drop --config and --set (or plan again with --budget)")
        plan = load_plan(args.plan)
        if plan.family != args.family:
            raise LmforgeError(f"{args.plan} plans a {plan.family} run, not a {args.family} one")
    else:
        parse_budget(args.budget)


def plan_for_cli(args: argparse.Namespace) -> BudgetPlan:
    """The plan of ``lmforge pretrain ... --budget B`` (probed here) or ``--plan FILE`` (read)."""
    check_budget_args(args)
    if args.plan is not None:
        plan = load_plan(args.plan)
        check_plan_data(plan, open_shards(args.data))
        return plan
    family = args.family
    model_over, train_over, recipe_over = split_sets(args.overrides, family)
    for key in ("max_steps", "max_time", "decay_steps"):
        if key in train_over:
            raise ConfigError(f"--budget plans {key} itself; drop --set {key} (or train without --budget)")
    train = None
    if get_family(family).trainer:  # a run file's [train] fields, then --set, then --device / --precision
        train = default_train_config(family, **{**run_file_train(family, args.config), **train_over,
                                                **compute_flags(args)})
    model = args.config
    name = None
    if is_config_file(args.config):
        model, name = model_from_choice(family, args.config), Path(args.config).name
    recipe = recipe_of(args, recipe_over)
    return plan_budget(family, open_shards(args.data), parse_budget(args.budget), model, train, recipe,
                       model_fields=model_over, name=name, search_shape=args.search_shape)
