"""`ember run` and `ember chat`, driven as real commands: subprocesses for one-shot runs and
pipes, a pseudo-terminal for the interactive REPL."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ember.llm import LLM

PROMPT = "Once upon a time"
STORY = (", there was a little girl named Lily. She loved to play outside in the park. "
         "One day, she saw a big, red ball.")
FAST = ["-t", "1"]  # one thread: the test machine's cores are shared


def ember(*args: str, stdin: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ember.cli", *args], input=stdin, check=False,
                          capture_output=True, text=True, timeout=timeout, env=os.environ.copy())


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.fixture(scope="module")
def stories_llm(stories_path: Path) -> LLM:
    return LLM(stories_path, n_threads=1)


# --- ember run -----------------------------------------------------------------------------------

def test_run_streams_the_greedy_story(stories_path: Path) -> None:
    proc = ember("run", str(stories_path), "-p", PROMPT, "--temp", "0", "-n", "40", *FAST)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == STORY + "\n"


def test_run_json(stories_path: Path) -> None:
    proc = ember("run", str(stories_path), "-p", PROMPT, "--temp", "0", "-n", "40", "--json", *FAST)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["text"] == STORY and out["finish_reason"] == "length"
    assert len(out["tokens"]) == 40
    assert out["usage"] == {"prompt_tokens": 5, "completion_tokens": 40, "total_tokens": 45,
                            "cached_tokens": 0}
    assert set(out["timings"]) == {"prompt_ms", "prompt_tokens_per_s", "generation_ms",
                                   "tokens_per_s"}
    assert out["timings"]["tokens_per_s"] > 0


def test_run_reads_the_prompt_from_stdin(stories_path: Path) -> None:
    proc = ember("run", str(stories_path), "-p", "-", "--temp", "0", "-n", "40", *FAST,
                 stdin=PROMPT + "\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == STORY + "\n"


def test_run_stop_strings(stories_path: Path) -> None:
    proc = ember("run", str(stories_path), "-p", PROMPT, "--temp", "0", "-n", "40",
                 "--stop", "Lily", "--stop", "girl", *FAST)
    assert proc.stdout == ", there was a little \n"


def test_run_seed(stories_path: Path) -> None:
    args = ["run", str(stories_path), "-p", PROMPT, "--temp", "1", "--top-k", "0", "--top-p", "1",
            "--min-p", "0", "-n", "30", *FAST]
    a, b, c = ember(*args, "--seed", "7"), ember(*args, "--seed", "7"), ember(*args, "--seed", "8")
    assert a.returncode == 0 and a.stdout == b.stdout and a.stdout != c.stdout


def test_run_chat_template(smollm2_path: Path) -> None:
    llm = LLM(smollm2_path, n_threads=1, n_ctx=512)
    question = "What is the capital of France?"
    want = llm.chat([{"role": "user", "content": question}], temperature=0.0, max_tokens=12)
    proc = ember("run", "-p", question, "--chat", "--temp", "0", "-n", "12", *FAST)  # demo model
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == want.text + "\n"
    messages = [{"role": "system", "content": "Answer in French."},
                {"role": "user", "content": question}]
    want = llm.chat(messages, temperature=0.0, max_tokens=12)
    proc = ember("run", str(smollm2_path), "-p", question, "--chat", "--system",
                 "Answer in French.", "--temp", "0", "-n", "12", *FAST)
    assert proc.stdout == want.text + "\n"


def test_run_truncates_the_middle_when_asked(stories_path: Path, stories_llm: LLM) -> None:
    prompt = " ".join(f"w{i}" for i in range(60))
    tokens = stories_llm.tokenize(prompt)
    assert len(tokens) > 64
    proc = ember("run", str(stories_path), "-p", prompt, "-c", "64", "-n", "4", "--temp", "0",
                 "--context-overflow", "truncate-middle", "--json", *FAST)
    assert proc.returncode == 0, proc.stderr
    usage = json.loads(proc.stdout)["usage"]
    assert (usage["prompt_tokens"], usage["dropped_tokens"]) == (60, len(tokens) - 60)
    assert "dropped_messages" not in usage  # 0: left out, as when nothing is dropped


@pytest.mark.parametrize("args, message", [
    (["missing.gguf", "-p", "hi"], "error: model file not found: missing.gguf"),
    (["{stories}", "-p", "hi", "--top-p", "2"], "error: [sampling] top_p must be in (0, 1], got 2"),
    (["{stories}", "-p", "hi", "--temp", "-1"], "error: [sampling] temperature must be >= 0"),
    (["{stories}", "-p", "hi", "--temp", "hot"], "error: Invalid value for '--temp'"),
    (["{stories}", "-p", "hi", "--bogus"], "error: No such option: --bogus"),
    (["{stories}"], "error: no prompt: pass -p TEXT, or -p - to read it from stdin"),
    (["{stories}", "-p", "hi", "--system", "x"], "error: --system needs --chat"),
    (["{stories}", "-p", "hi", "-t", "0"], "error: --threads must be > 0, got 0"),
    (["{stories}", "-p", "hi", "-n", "-3"], "error: max_tokens must be >= 0, got -3"),
    (["{stories}", "-p", "hi " * 100, "-c", "16"], "more than the context of 16 tokens"),
    (["{stories}", "-p", "hi", "--context-overflow", "cut"],
     "error: --context-overflow must be one of error, truncate-middle, shift, got 'cut'"),
])
def test_run_errors_are_one_line(stories_path: Path, args: list[str], message: str) -> None:
    args = [a.replace("{stories}", str(stories_path)) for a in args]
    line = one_error_line(ember("run", *args))
    assert message in line


def test_chat_errors_are_one_line(tmp_path: Path) -> None:
    assert "model file not found" in one_error_line(ember("chat", str(tmp_path / "x.gguf")))
    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"not a gguf file at all")
    assert one_error_line(ember("chat", str(not_gguf))).startswith("error: [gguf]")


@pytest.mark.parametrize("command", ["run", "chat", "bench"])
def test_an_unsupported_architecture_is_one_line(tmp_path: Path, command: str) -> None:
    import gguf
    import numpy as np

    path = tmp_path / "phi2.gguf"
    writer = gguf.GGUFWriter(str(path), "phi2")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((8, 16), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    args = {"run": ["-p", "hi"], "chat": [], "bench": ["-p", "8", "-n", "4"]}[command]
    line = one_error_line(ember(command, str(path), *args, stdin=""))
    assert line == (f"error: [model] {path}: architecture 'phi2' is not supported; supported "
                    "architectures: llama, qwen2, qwen3, phi3, gemma3, gemma2, bert, qwen2moe, "
                    "qwen3moe, smollm3, gpt-oss, qwen2vl")


# --- ember chat through a pipe -------------------------------------------------------------------

def test_chat_from_a_pipe(stories_path: Path, stories_llm: LLM) -> None:
    turn1 = [{"role": "user", "content": "Hello"}]
    a1 = stories_llm.chat(turn1, temperature=0.0, max_tokens=20).text
    turn2 = [*turn1, {"role": "assistant", "content": a1}, {"role": "user", "content": "Go on"}]
    a2 = stories_llm.chat(turn2, temperature=0.0, max_tokens=20).text
    fresh = stories_llm.chat([{"role": "user", "content": "Go on"}], temperature=0.0,
                             max_tokens=20).text
    assert a2 != fresh  # the history matters, so the /clear below is visible

    proc = ember("chat", str(stories_path), "--temp", "0", "-n", "20", *FAST,
                 stdin="Hello\n\nGo on\n/clear\nGo on\n/exit\nnever read\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{a1}\n{a2}\n{fresh}\n"
    assert "\x1b" not in proc.stdout + proc.stderr  # no prompts or colours without a terminal
    stats = [line for line in proc.stderr.splitlines() if "tokens/s" in line]
    assert len(stats) == 3 and all(re.fullmatch(r"\[20 tokens, [\d.]+ tokens/s, prompt \d+ ms\]", s)
                                   for s in stats)


def test_chat_keeps_going_past_the_context(stories_path: Path) -> None:
    """A piped conversation longer than a 256-token context: by default the oldest turns are
    left out of each prompt (context_fit's shift, as ember.LLM does it), and a note on stderr
    says how many; with --context-overflow error the chat stops with one error line."""
    lines = [f"Cat {i}?" for i in range(7)]
    llm = LLM(stories_path, n_threads=1, n_ctx=256, context_overflow="shift")
    history: list[dict[str, str]] = []
    answers, notes = [], []
    for line in lines:
        history.append({"role": "user", "content": line})
        result = llm.chat(history, temperature=0.0, max_tokens=20)
        history.append({"role": "assistant", "content": result.text})
        answers.append(result.text)
        u = result.usage
        if u.dropped_messages:
            notes.append(f"[context full: the {u.dropped_messages} oldest messages "
                         f"({u.dropped_tokens} tokens) left out] ")
    llm.close()
    assert len(notes) >= 3  # the premise: the later turns drop some

    proc = ember("chat", str(stories_path), "-c", "256", "--temp", "0", "-n", "20", *FAST,
                 stdin="\n".join(lines) + "\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "".join(a + "\n" for a in answers)
    assert [line[:line.index("[", 1)] for line in proc.stderr.splitlines()
            if line.startswith("[context full")] == notes

    proc = ember("chat", str(stories_path), "-c", "256", "--temp", "0", "-n", "20", *FAST,
                 "--context-overflow", "error", stdin="\n".join(lines) + "\n")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines()[-1].startswith("error: [request] the prompt has ")
    assert "more than the context of 256 tokens" in proc.stderr.splitlines()[-1]
    n_shown = len(proc.stderr.splitlines()) - 1  # the answers before the error, one stats line each
    assert 0 < n_shown < len(lines) and proc.stdout == "".join(a + "\n" for a in answers[:n_shown])


def test_chat_paris_from_a_pipe() -> None:
    proc = ember("chat", "--system", "You are a helpful assistant.", "--temp", "0", "-n", "32",
                 *FAST, stdin="What is the capital of France?\n")  # the demo model
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "The capital of France is Paris.\n"
    assert re.fullmatch(r"\[7 tokens, [\d.]+ tokens/s, prompt \d+ ms\]\n", proc.stderr)


def test_chat_system_message_from_a_pipe(stories_path: Path, stories_llm: LLM) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    want = stories_llm.chat(messages, temperature=0.0, max_tokens=10).text
    proc = ember("chat", str(stories_path), "--system", "Be brief.", "--temp", "0", "-n", "10",
                 *FAST, stdin="Hi\n")  # EOF ends the chat
    assert proc.returncode == 0 and proc.stdout == want + "\n"


def test_chat_speculates_with_the_same_answers(stories_path: Path, smollm2_path: Path,
                                               stories_llm: LLM) -> None:
    want = stories_llm.chat([{"role": "user", "content": "Hello"}], temperature=0.0,
                            max_tokens=30).text
    for spec in (["--spec", "ngram"], ["--draft-model", str(stories_path), "--draft-max", "4"]):
        proc = ember("chat", str(stories_path), "--temp", "0", "-n", "30", *spec, *FAST,
                     stdin="Hello\n")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == want + "\n"
    # The draft model is loaded and checked (its vocabulary is not the model's).
    line = one_error_line(ember("chat", str(stories_path), "--draft-model", str(smollm2_path),
                                *FAST, stdin="Hello\n"))
    assert line == (f"error: [speculation] the draft model '{smollm2_path}' has 49152 tokens, "
                    "the model 512: a draft model needs the same vocabulary")


# --- ember chat in a terminal ----------------------------------------------------------------

class Terminal:
    """A command on a pseudo-terminal that is its controlling terminal (so Ctrl-C typed there
    interrupts it); its stdin, stdout and stderr are all the terminal."""

    def __init__(self, *args: str) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: become the command
            os.execve(sys.executable, [sys.executable, "-m", "ember.cli", *args], os.environ)
        self.seen = b""
        self.exit_code: int | None = None

    def exited(self) -> bool:
        if self.exit_code is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid != 0:
                self.exit_code = os.waitstatus_to_exitcode(status)
        return self.exit_code is not None

    def read_until(self, pattern: str, timeout: float = 120) -> str:
        """Everything up to and including the first match of `pattern` not read before."""
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern.encode())
        while True:
            match = regex.search(self.seen)
            if match:
                out, self.seen = self.seen[:match.end()], self.seen[match.end():]
                return out.decode(errors="replace")
            left = deadline - time.monotonic()
            readable = select.select([self.fd], [], [], max(0.0, min(left, 1.0)))[0]
            if readable:
                try:
                    self.seen += os.read(self.fd, 4096)
                    continue
                except OSError:  # the command exited and closed the terminal
                    pass
            if left <= 0 or self.exited():
                raise AssertionError(f"no {pattern!r} in {self.seen!r}")

    def type(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def close(self, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        try:
            while not self.exited():
                if time.monotonic() > deadline:
                    os.kill(self.pid, signal.SIGKILL)
                    raise AssertionError("the command did not exit")
                try:  # drain the terminal so the command never blocks writing to it
                    if select.select([self.fd], [], [], 0.1)[0]:
                        os.read(self.fd, 4096)
                except OSError:
                    time.sleep(0.1)
            return self.exit_code
        finally:
            os.close(self.fd)


def test_chat_repl_in_a_terminal(stories_path: Path, stories_llm: LLM) -> None:
    turn1 = [{"role": "user", "content": "Hello"}]
    a1 = stories_llm.chat(turn1, temperature=0.0, max_tokens=20).text
    turn2 = [*turn1, {"role": "assistant", "content": a1}, {"role": "user", "content": "Go on"}]
    a2 = stories_llm.chat(turn2, temperature=0.0, max_tokens=20).text

    term = Terminal("chat", str(stories_path), "--temp", "0", "-n", "20", *FAST)
    banner = term.read_until(r">>> ")
    assert "ember chat: stories260K.gguf" in banner and "/clear" in banner
    term.type("Hello\r")
    answer = term.read_until(r"tokens/s.*\]\x1b\[0m")
    assert a1.replace("\n", "\r\n") in answer  # the terminal turns \n into \r\n
    assert "\x1b[2m[20 tokens, " in answer  # the speed, dimmed
    term.read_until(r">>> ")
    term.type("Go on\r")
    assert a2.replace("\n", "\r\n") in term.read_until(r"tokens/s")
    term.read_until(r">>> ")
    term.type("/clear\r")
    assert "(new conversation)" in term.read_until(r">>> ")
    term.type("/exit\r")
    assert term.close() == 0


def test_chat_ctrl_c_stops_an_answer_and_ctrl_d_quits(smollm2_path: Path) -> None:
    # A long answer from the demo model, stopped after its first words.
    term = Terminal("chat", str(smollm2_path), "--temp", "0", "-n", "60", "-c", "1024", *FAST)
    term.read_until(r">>> ")
    term.type("Write a long story about a dragon.\r")
    term.read_until(r"dragon\.\r\n")  # the terminal's echo of the line
    term.read_until(r"\w+ \w+ \w+")  # the answer has started
    term.type("\x03")
    term.read_until(r"\[interrupted\]")
    term.read_until(r">>> ")
    # The prompt is drawn just before input() takes over SIGINT; on a loaded machine a Ctrl-C
    # typed the instant it appears can land in between, so give input() a moment.
    time.sleep(1.0)
    term.type("\x03")  # at the prompt, Ctrl-C only explains how to quit
    assert "Ctrl-D" in term.read_until(r">>> ")
    term.type("/clear\r")
    term.read_until(r">>> ")
    term.type("Say hi.\r")
    term.read_until(r"tokens/s")  # the next answer runs to its end
    term.read_until(r">>> ")
    term.type("\x04")
    assert term.close() == 0


def test_bench_spec_times_both_modes_on_the_same_request(stories_path: Path) -> None:
    proc = ember("bench", str(stories_path), "--spec", "prediction", "-n", "48", "-r", "2",
                 *FAST, "--json")
    assert proc.returncode == 0, proc.stderr
    plain, spec = json.loads(proc.stdout)
    assert (plain["spec"], spec["spec"]) == ("none", "prediction")
    # Greedy either way: the same output, so the same length; the prediction is the plain run's
    # own output as text, so drafts are made and kept (how many is the back-off's call).
    assert plain["test"] == spec["test"] == "copy48"
    assert plain["drafted"] == 0
    assert 0 < spec["accepted"] <= spec["drafted"]
    assert plain["tokens_per_second"] > 0 and spec["speedup"] > 0
