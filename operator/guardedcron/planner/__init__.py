"""The reconcile pass as a plan (pure): what a pass over one GuardedCronJob does, as a
sequence of actions the handlers' executor performs and answers (planner/pass_plan.py)."""

from guardedcron.planner.actions import Observed, PassResult, PassView
from guardedcron.planner.pass_plan import Plan, plan_pass
from guardedcron.planner.slots import TIMER_SECONDS, wants_timer

__all__ = ["TIMER_SECONDS", "Observed", "PassResult", "PassView", "Plan", "plan_pass", "wants_timer"]
