"""Limits on rendering a chat template: time and size, so a hostile GGUF's template (loops,
recursion, huge strings) fails instead of hanging or exhausting memory.

The template comes from the model file, so it is untrusted code. Jinja's sandbox already
blocks Python internals (`__class__`, `os.popen`) and caps range() at 100,000 items; this adds:

- time: a watchdog raises RenderTimeout in the rendering thread at the deadline (between two
  bytecodes: empty nested loops are interrupted too), and every intercepted operation checks
  the clock;
- size: every string or list the template builds through an operator (`+`, `*`, `%`, `~`),
  a call, a filter or an output write is charged to a budget before or as it is built: one
  value over `max_chars`, or all of them together over `max_total_chars`, raises RenderTooLarge;
  integer arguments over max_int_arg (`center(10**9)`) and format widths of 7+ digits are
  refused before they allocate; `**` and `*` on integers are capped at 65,536 bits;
- the rendered text itself stops at max_chars characters.

Memory a render can allocate is thereby bounded by about max_total_chars characters plus what
1 s of pure looping over fixed-size values can build.
"""

from __future__ import annotations

import ctypes
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from functools import wraps
from typing import Any, TypeVar

import jinja2.compiler
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

T = TypeVar("T")

MAX_INT_BITS = 1 << 16
_FORMAT_WIDTH = re.compile(r"\d{7,}")  # a width or precision of a million or more


@dataclass(frozen=True)
class RenderLimits:
    max_seconds: float = 1.0
    max_chars: int = 1 << 20          # the output, and any one string or list built on the way
    max_total_chars: int = 16 << 20   # everything built on the way, together
    max_int_arg: int = 1 << 20        # integer arguments of calls and filters (widths, counts)

    def describe(self) -> str:
        return f"{self.max_seconds:g} s, {self.max_chars} characters"


class RenderLimitError(Exception):
    """Base of the two limits' errors; ember.chat.template turns them into ChatTemplateErrors."""


class RenderTimeout(RenderLimitError):
    pass


class RenderTooLarge(RenderLimitError):
    pass


class _Budget:
    """What one render may still spend (one per render, in a ContextVar)."""

    def __init__(self, limits: RenderLimits) -> None:
        self.limits = limits
        self.deadline = time.monotonic() + limits.max_seconds
        self.total = 0

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise RenderTimeout(f"it ran longer than {self.limits.max_seconds:g} s")

    def charge(self, n_chars: int, what: str) -> None:
        self.tick()
        if n_chars > self.limits.max_chars:
            raise RenderTooLarge(f"it builds {what} of {n_chars} characters, more than the "
                                 f"limit of {self.limits.max_chars}")
        self.total += n_chars
        if self.total > self.limits.max_total_chars:
            raise RenderTooLarge(f"it builds more than {self.limits.max_total_chars} characters "
                                 "of strings in all")

    def check_args(self, args: tuple[Any, ...], kwargs: dict[str, Any], what: str) -> None:
        self.tick()
        for value in (*args, *kwargs.values()):
            if (isinstance(value, int) and not isinstance(value, bool)
                    and abs(value) > self.limits.max_int_arg):
                raise RenderTooLarge(f"{what} got the integer argument {value}, more than the "
                                     f"limit of {self.limits.max_int_arg}")

    def check_format(self, fmt: Any, what: str) -> None:
        if isinstance(fmt, str) and (match := _FORMAT_WIDTH.search(fmt)):
            raise RenderTooLarge(f"{what} has a format width of {match.group()} characters")


_BUDGET: ContextVar[_Budget | None] = ContextVar("ember_render_budget", default=None)


def _budget() -> _Budget:
    budget = _BUDGET.get()
    if budget is None:  # rendered outside bounded_render (not done by ember): default limits
        budget = _Budget(RenderLimits())
        _BUDGET.set(budget)
    return budget


def _size(value: Any) -> int | None:
    return len(value) if isinstance(value, (str, list, tuple, bytes)) else None


def _charge_result(budget: _Budget, value: Any, what: str) -> Any:
    size = _size(value)
    if size is not None:
        budget.charge(size, what)
    return value


class _BoundedCodeGenerator(jinja2.compiler.CodeGenerator):
    """Jinja's compiler with every output write and every `~` routed through the budget."""

    def visit_Concat(self, node: jinja2.nodes.Concat, frame: jinja2.compiler.Frame) -> None:
        self.write("environment.bounded_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")

    def _output_const_repr(self, group: Any) -> str:
        return f"environment.charged({super()._output_const_repr(group)})"

    def _output_child_pre(self, node: jinja2.nodes.Expr, frame: jinja2.compiler.Frame,
                          finalize: Any) -> None:
        self.write("environment.charged(")
        super()._output_child_pre(node, frame, finalize)

    def _output_child_post(self, node: jinja2.nodes.Expr, frame: jinja2.compiler.Frame,
                           finalize: Any) -> None:
        super()._output_child_post(node, frame, finalize)
        self.write(")")


def _bounded_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    @wraps(func)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        budget = _budget()
        budget.check_args(args, kwargs, f"the filter '{name}'")
        if name == "format" and args:
            budget.check_format(args[0], "the filter 'format'")
        return _charge_result(budget, func(*args, **kwargs), f"a value (filter '{name}')")

    return bounded


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The immutable sandbox with the size and time checks of this module."""

    code_generator_class = _BoundedCodeGenerator
    intercepted_binops = frozenset({"+", "*", "**", "%"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.globals.pop("lipsum", None)  # generates text by the paragraph; no template needs it

    def bound_filters(self) -> None:
        """Wraps every filter (call after adding custom ones)."""
        self.filters = {name: _bounded_filter(name, f) for name, f in self.filters.items()}

    def charged(self, value: Any) -> Any:
        return _charge_result(_budget(), value, "output")

    def bounded_concat(self, parts: tuple[Any, ...]) -> str:
        budget = _budget()
        texts = [str(p) for p in parts]
        budget.charge(sum(len(t) for t in texts), "a string ('~')")
        return "".join(texts)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        budget = _budget()
        budget.tick()
        both_ints = isinstance(left, int) and isinstance(right, int)
        if operator == "**" and both_ints and right > 0 and abs(left) > 1:
            if abs(left).bit_length() * right > MAX_INT_BITS:
                raise RenderTooLarge(f"{left} ** {right} has more than {MAX_INT_BITS} bits")
        elif operator == "*" and both_ints:
            if abs(left).bit_length() + abs(right).bit_length() > MAX_INT_BITS:
                raise RenderTooLarge(f"a product of more than {MAX_INT_BITS} bits")
        elif operator == "*":
            seq, count = (left, right) if isinstance(right, int) else (right, left)
            size = _size(seq)
            if size is not None and isinstance(count, int):
                budget.charge(size * max(count, 0), "a repeated string or list ('*')")
        elif operator == "+":
            a, b = _size(left), _size(right)
            if a is not None and b is not None:
                budget.charge(a + b, "a string or list ('+')")
        elif operator == "%" and isinstance(left, str):
            budget.check_format(left, "the '%' format")
            budget.check_args(right if isinstance(right, tuple) else (right,), {}, "'%'")
        result = super().call_binop(context, operator, left, right)
        if operator == "%":
            _charge_result(budget, result, "a string ('%')")
        return result

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        budget = _budget()
        what = f"'{getattr(__obj, '__name__', 'a call')}'"
        budget.check_args(args, kwargs, what)
        if getattr(__obj, "__name__", None) in ("format", "format_map"):
            # The sandbox wraps str.format (update_wrapper): the string is the wrapped method's.
            method = getattr(__obj, "__wrapped__", __obj)
            budget.check_format(getattr(method, "__self__", None), what)
        result = super().call(__context, __obj, *args, **kwargs)
        return _charge_result(budget, result, f"a value ({what})")


# --- the deadline --------------------------------------------------------------------------------

# PyThreadState_SetAsyncExc(thread id, exception type), and with NULL to clear a pending one.
_set_async_exc = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.py_object)(
    ("PyThreadState_SetAsyncExc", ctypes.pythonapi))
_clear_async_exc = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p)(
    ("PyThreadState_SetAsyncExc", ctypes.pythonapi))


class _Watchdog:
    """Raises RenderTimeout in thread `thread_id` once `seconds` pass, unless disarmed first.
    The lock makes "fire" and "disarm" exclusive, and disarm clears an exception that was
    raised but not delivered yet, so it can never land in code after the render."""

    def __init__(self, thread_id: int, seconds: float) -> None:
        self._thread_id = thread_id
        self._lock = threading.Lock()
        self._done = False
        self._fired = False
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        with self._lock:
            if not self._done:
                self._fired = True
                _set_async_exc(self._thread_id, RenderTimeout)

    def disarm(self) -> None:
        with self._lock:
            self._done = True
            if self._fired:
                _clear_async_exc(self._thread_id, None)  # drops an undelivered exception
        self._timer.cancel()


def bounded_render(chunks: Callable[[], Iterator[str]], limits: RenderLimits) -> str:
    """Joins the chunks of a template's generate() under `limits`; raises RenderLimitError
    (and whatever the template raises) in the calling thread."""
    token = _BUDGET.set(_Budget(limits))
    watchdog: _Watchdog | None = None
    try:
        try:
            # Inside the try: a deadline shorter than the watchdog's start fires before the
            # assignment, and its exception must be this render's error all the same.
            watchdog = _Watchdog(threading.get_ident(), limits.max_seconds)
            out: list[str] = []
            n_chars = 0
            for chunk in chunks():
                n_chars += len(chunk)
                if n_chars > limits.max_chars:
                    raise RenderTooLarge(f"its output passes {limits.max_chars} characters")
                out.append(chunk)
            return "".join(out)
        finally:
            if watchdog is not None:  # else it fired during its own start: nothing is pending
                watchdog.disarm()
    except RenderTimeout:
        raise RenderTimeout(f"it ran longer than {limits.max_seconds:g} s") from None
    finally:
        _BUDGET.reset(token)
