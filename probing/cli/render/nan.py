"""What `probing PID nan` says about the session of checks under way, in words: the weights
when the checks began, the verdict on the first NaN/Inf, and where to look when the cause is
earlier than the checks. Every string the job controls (module and tensor names, record
paths) is made inert; the agent's answer is not trusted to have the documented shape."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from . import inert
from .files import counted

# Tensors and modules named on one line; the rest are counted.
NAMED = 4


def _names(names: List[str]) -> str:
    shown = [inert(str(name)) for name in names[:NAMED]]
    rest = len(names) - len(shown)
    if rest > 0:
        return ", ".join(shown) + f" and {rest} more"
    if len(shown) > 1:
        return ", ".join(shown[:-1]) + " and " + shown[-1]
    return "".join(shown)


def _counts(nans: Any, infs: Any) -> str:
    """Counts of a weight check; an event's tensor is reduced to one value (agent ledger.py):
    no count, NaN (both None) or Infs alone (no NaN, the Infs None)."""
    if nans is None and infs is None:
        return "NaN"
    if nans == 0 and infs is None:
        return "Inf"
    parts = []
    if isinstance(nans, int) and nans:
        parts.append(f"{nans} NaN")
    if isinstance(infs, int) and infs:
        parts.append(f"{infs} Inf")
    return ", ".join(parts) or "NaN/Inf"


def _count(value: Any) -> int:
    return value if isinstance(value, int) else 0


def _dicts(value: Any) -> List[Dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _tensors(findings: List[Dict[str, Any]], total: Any) -> str:
    shown = [f"{inert(str(f.get('name')))} ({_counts(f.get('nan_count'), f.get('inf_count'))})"
             for f in findings[:NAMED]]  # fmt: skip
    more = total - len(shown) if isinstance(total, int) and total > len(shown) else 0
    return ", ".join(shown) + (f" and {more} more" if more else "")


def _found_line(weights: Dict[str, Any], findings: List[Dict[str, Any]]) -> str:
    """The weights the start check read NaN/Inf: those already so when the checks began, and
    those it read only after an update and a NaN/Inf (whether they were before is not known)."""
    already = [f for f in findings if f.get("already") is not False]
    later = [f for f in findings if f.get("already") is False]
    total, already_total = weights.get("nonfinite_count"), weights.get("already_count")
    parts = []
    if already:
        modules = [str(name) for name in weights.get("modules") or [] if isinstance(name, str)]
        parts.append(
            f"the weights of {_names(modules)} were already NaN/Inf when checks began (the cause is "
            f"earlier): {_tensors(already, already_total)}"
        )
    if later:
        later_total = (
            total - already_total if isinstance(total, int) and isinstance(already_total, int) else None
        )
        parts.append(
            f"{_tensors(later, later_total)} NaN/Inf when read, after an update and a NaN/Inf since "
            "checks began (whether they were before is not known)"
        )
    return "; ".join(parts)


def weights_line(weights: Dict[str, Any], wait_s: Any) -> str:
    """The weights when the checks began: found NaN/Inf, finite, or not checked yet and why."""
    state = weights.get("state")
    findings = _dicts(weights.get("nonfinite"))
    checked = _count(weights.get("checked"))
    if findings:
        line = _found_line(weights, findings)
        if state != "done":
            line += f"; still checking the rest ({counted(checked, 'tensor')} so far)"
    elif state == "waiting":
        wait = f" within {wait_s:g} s" if isinstance(wait_s, (int, float)) else ""
        line = (
            f"not checked yet: the job called no hooked module{wait} (they are checked at its next "
            "call; `nan status` says what was found)"
        )
    elif state == "checking":
        line = (
            f"being checked a little at each step ({counted(checked, 'tensor')} so far, none NaN/Inf); "
            "`nan status` says what was found"
        )
    elif checked:
        done = weights.get("done_step")
        line = f"finite when checks began ({counted(checked, 'tensor')} checked by step {done})"
    else:
        line = "none found yet (no model has been called since checks began)"
    if weights.get("error"):
        line += f"; the check stopped: {inert(str(weights['error']))}"
    return "  weights:    " + line


def verdict(event: Dict[str, Any]) -> str:
    """Why the first NaN/Inf of the session arose where it did."""
    module = inert(str(event.get("module")))
    weights_finite = event.get("weights_finite")
    if event.get("input_finite") is False:
        return (
            "what came in was already NaN/Inf: it came from before this module (the data, or code no "
            "hook sees)"
        )
    if weights_finite is False:
        names = [str(name) for name in event.get("nonfinite_weights") or [] if isinstance(name, str)]
        already = event.get("weights_already_nonfinite")
        if already is True:
            return f"the weights of {module} were already NaN/Inf when checks began (the cause is earlier)"
        if already is False:
            return (
                f"the weights of {module} went NaN/Inf after checks began, with no NaN/Inf seen before: "
                f"an optimizer update or the job's own code wrote them ({_names(names)})"
            )
        return (
            f"the weights of {module} held NaN/Inf ({_names(names)}); whether they did when checks "
            "began is not known (the check of the weights had not read them yet, or read them only after "
            "an update)"
        )
    if weights_finite is True:
        return f"{module} made it from finite inputs and finite weights (its own computation)"
    return f"{module} made it from finite inputs (its weights were not all checked: the check stops at 10 ms)"


def event_line(event: Dict[str, Any]) -> str:
    module, module_type = inert(str(event.get("module"))), inert(str(event.get("module_type")))
    where = (
        f"step {event.get('step')}, {module} ({module_type}) "
        f"{inert(str(event.get('stage')))} {inert(str(event.get('tensor')))} "
        f"({_counts(event.get('nan_count'), event.get('inf_count'))})"
    )
    return f"  first NaN/Inf: {where}: {verdict(event)}"


def history_line(session: Dict[str, Any]) -> str:
    """Where to look when the cause is earlier than these checks."""
    earlier = session.get("earlier_events")
    records = [str(path) for path in session.get("records_written") or [] if isinstance(path, str)]
    pointers = []
    if isinstance(earlier, dict):
        events = counted(_count(earlier.get("count")), "event")
        pointers.append(
            f"python.nan_events holds {events} from before these checks, "
            f"the first at step {earlier.get('step')} ({inert(str(earlier.get('module')))}, "
            f"{inert(str(earlier.get('stage')))})"
        )
    if records:
        pointers.append(f"records this process wrote: {_names(records)}")
    if not pointers:
        return (
            "  earlier:    nothing in this process shows when (no earlier NaN checks, no record written); "
            "`probing records` lists records of earlier runs; PROBING=1 PROBING_NAN=1 checks from the "
            "job's first step"
        )
    return "  earlier:    " + "; ".join(pointers)


def nan_session_lines(session: Any) -> List[str]:
    """The lines `nan on` / `nan status` add while the checks are on."""
    if not isinstance(session, dict):
        return []
    weights = session.get("weights")
    lines = [weights_line(weights, session.get("weights_wait_s"))] if isinstance(weights, dict) else []
    event: Optional[Dict[str, Any]] = (
        session.get("first_event") if isinstance(session.get("first_event"), dict) else None
    )
    if event is not None:
        lines.append(event_line(event))
    found_already = isinstance(weights, dict) and any(
        finding.get("already") is not False for finding in _dicts(weights.get("nonfinite"))
    )
    cause_earlier = found_already or (event is not None and event.get("weights_already_nonfinite") is True)
    if cause_earlier:
        lines.append(history_line(session))
    return lines
