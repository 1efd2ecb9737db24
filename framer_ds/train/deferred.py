"""What a stop signal put off is done first when the run resumes (train/safe_point.py says why it is put
off). Its own module: the loop calls it once, before its first step, and the step actions need not know."""

from __future__ import annotations

from framer_ds.train.actions import StepAction, StepContext, run_due_actions
from framer_ds.train.console import say


def run_deferred_actions(actions: list[StepAction], ctx: StepContext) -> None:
    """A run resumed from a stop checkpoint first does what the stop put off at that step (the names in
    its trainer state, with the evaluation a put-off `keep-best` judges), from the weights and random
    state they would have seen then; the uninterrupted run would have done them at that point too, so
    the resumed run's trajectory stays the same. Every rank: the names come from the checkpoint."""
    state = ctx.state
    names = list(state.deferred_actions)
    if not names:
        return
    if state.deferred_eval is not None:
        ctx.eval_metrics, ctx.evaluated_at = dict(state.deferred_eval), state.global_step
    state.deferred_actions, state.deferred_eval = [], None
    ctx.done = state.global_step >= ctx.run.plan.total_steps
    say(ctx.run.accelerator, f"step {state.global_step}: first what the stop put off: {', '.join(names)}")
    run_due_actions(actions, ctx, due=lambda action: action.due_on_resume(ctx, set(names)))
