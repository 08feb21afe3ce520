"""Corpus and policy validation (every error with its line number), the shipped corpora and
policies, and the parser of SGLang's /generate response."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from kdtree_parity.corpus import CorpusError, load_corpus, parse_corpus
from kdtree_parity.generation import MalformedResponse, parse_generate_response
from kdtree_parity.policy import PolicyError, load_policy, parse_policy


def test_corpus_errors_name_every_bad_line() -> None:
    data = "\n".join(
        [
            '{"id": "ok-1", "text": "hello"}',
            "",
            '{"id": "bad-json", "text": ',
            '{"id": "both", "text": "x", "input_ids": [1]}',
            '{"text": "no id"}',
            '{"id": "ok-1", "text": "again"}',
            '{"id": "ids", "input_ids": [1, -2]}',
            '{"id": "mnt", "text": "x", "max_new_tokens": 0, "colour": "red"}',
            '["not", "an", "object"]',
            '{"id": "tags", "text": "x", "tags": "code"}',
        ]
    ).encode()
    with pytest.raises(CorpusError) as info:
        parse_corpus(data, source="c.jsonl")
    lines = Counter(line for line, _ in info.value.problems)
    assert sorted(lines) == [3, 4, 5, 6, 7, 8, 9, 10]
    text = str(info.value)
    assert "c.jsonl:3: invalid JSON" in text
    assert "c.jsonl:4: exactly one of 'text', 'input_ids' or 'messages'" in text
    assert "c.jsonl:5: 'id' must be a non-empty string" in text
    assert "c.jsonl:6: duplicate id 'ok-1' (first on line 1)" in text
    assert "c.jsonl:7: 'input_ids' must be" in text
    assert "c.jsonl:8: unknown key(s) colour" in text and "c.jsonl:8: 'max_new_tokens'" in text
    assert "c.jsonl:9: expected a JSON object" in text
    assert "c.jsonl:10: 'tags' must be" in text


def test_corpus_rejects_empty_and_non_utf8() -> None:
    with pytest.raises(CorpusError, match="no entries"):
        parse_corpus(b"\n\n")
    with pytest.raises(CorpusError, match=":2: not valid UTF-8"):
        parse_corpus(b'{"id": "a", "text": "x"}\n{"id": "b", "text": "\xff"}\n')


def test_corpus_refuses_deep_nesting_and_lone_surrogates() -> None:
    deep = b'{"id": "d", "text": "x", "tags": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"
    with pytest.raises(CorpusError, match=":2: invalid JSON: nested too deeply"):
        parse_corpus(b'{"id": "a", "text": "x"}\n' + deep)
    # JSON may escape a lone surrogate; such a string has no UTF-8 form, so no target gets it.
    with pytest.raises(CorpusError, match=r":1: 'text' is not valid Unicode: lone surrogate"):
        parse_corpus(b'{"id": "a", "text": "ab\\ud800"}\n')
    with pytest.raises(CorpusError, match=r"'tags' is not valid Unicode"):
        parse_corpus(b'{"id": "a", "text": "x", "tags": ["\\udfff"]}\n')
    paired = parse_corpus(b'{"id": "a", "text": "\\ud83d\\ude00"}\n')  # a real pair: fine
    assert paired.entries[0].text == "\U0001f600"


def test_policy_file_that_is_not_utf8_is_a_policy_error(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_bytes(b"gate:\n  min_prompts: 1 # caf\xe9\n")
    with pytest.raises(PolicyError, match=r"p.yaml:2: not valid UTF-8"):
        load_policy(path)


def test_corpus_keeps_entries_and_hash(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    raw = b'{"id": "a", "text": "x", "tags": ["t"], "max_new_tokens": 4}\n{"id": "b", "input_ids": [1, 2]}\n'
    path.write_bytes(raw)
    corpus = load_corpus(path)
    assert [e.id for e in corpus.entries] == ["a", "b"]
    assert corpus.entries[0].max_new_tokens == 4 and corpus.entries[1].input_ids == (1, 2)
    assert corpus.entries[1].line == 2 and corpus.raw == raw
    import hashlib

    assert corpus.sha256 == hashlib.sha256(raw).hexdigest()
    with pytest.raises(CorpusError, match="no such file"):
        load_corpus(tmp_path / "missing.jsonl")


def test_shipped_default_corpus_covers_what_a_gate_needs() -> None:
    corpus = load_corpus("default")
    assert len(corpus) >= 200
    tags = Counter(t for e in corpus.entries for t in e.tags)
    assert tags["code"] >= 30 and tags["math"] >= 30 and tags["prose"] >= 30
    languages = {t for t in tags if t.startswith("lang:")}
    assert len(languages) >= 8
    long_entries = [e for e in corpus.entries if "long" in e.tags]
    assert len(long_entries) >= 3 and all(len(e.text or "") > 2000 for e in long_entries)


def test_shipped_short_corpus_fits_the_short_policy() -> None:
    corpus = load_corpus("short")
    policy = load_policy("short").policy
    assert policy.gate.min_prompts <= len(corpus) <= 40


def test_shipped_policies_parse() -> None:
    default = load_policy("default")
    assert default.policy.gate.max_hard_divergences == 0
    assert default.policy.gate.min_prompts <= len(load_corpus("default"))
    assert len(default.sha256) == 64


def test_policy_errors_carry_yaml_line_numbers() -> None:
    text = "\n".join(
        [
            "replay:",
            "  concurrency: 4",
            "  timeout_s: -1",
            "gate:",
            "  min_prompts: many",
            "  max_hard_divergence: 0",
            "compare:",
            "  near_tie_epsilon: 0.1",
        ]
    )
    with pytest.raises(PolicyError) as info:
        parse_policy(text, source="p.yaml")
    problems = dict(info.value.problems)
    assert "replay.timeout_s" in problems[3]
    assert "gate.min_prompts" in problems[5]
    assert "gate.max_hard_divergence" in problems[6] and "Extra inputs" in problems[6]


def test_policy_rejects_bad_yaml_and_non_mappings() -> None:
    with pytest.raises(PolicyError, match=r"p.yaml:3: invalid YAML"):
        parse_policy("gate:\n  min_prompts: 1\n\tmax_hard_divergences: 0\n", source="p.yaml")
    with pytest.raises(PolicyError, match="YAML mapping"):
        parse_policy("- a\n- b\n")
    assert parse_policy("").policy.gate.max_hard_divergences == 0


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        pytest.param(
            "gate:\n  max_hard_divergences: 0\n  max_hard_divergences: 100\n",
            3,
            "duplicate key 'max_hard_divergences' (first on line 2)",
            id="duplicate-key",
        ),
        pytest.param(
            "gate:\n  min_prompts: 50\nreplay:\n  retries: 1\ngate:\n  min_prompts: 1\n",
            5,
            "duplicate key 'gate' (first on line 1)",
            id="duplicate-section",
        ),
        pytest.param("gate: {min_prompts: 5, min_prompts: 1}\n", 1, "duplicate key", id="flow"),
        pytest.param("gate:\n  min_prompts: true\n", 2, "gate.min_prompts", id="true-as-int"),
        pytest.param("gate:\n  min_prompts: '20'\n", 2, "gate.min_prompts", id="string-int"),
        pytest.param(
            "gate:\n  allow_aa_divergence: 'no'\n", 2, "gate.allow_aa_divergence", id="string-bool"
        ),
        pytest.param("replay:\n  timeout_s: '60'\n", 2, "replay.timeout_s", id="string-float"),
        pytest.param(
            "gate:\n  max_logprob_drift_p99: .inf\n", 2, "finite number", id="inf-threshold"
        ),
        pytest.param(
            "compare:\n  near_tie_epsilon: .nan\n", 2, "finite number", id="nan-threshold"
        ),
    ],
)
def test_policies_that_read_differently_from_what_they_say_are_refused(
    text: str, line: int, message: str
) -> None:
    """Before: the last duplicate won, true became 1, '20' became 20, 'no' became false and .inf
    passed (to crash the report later)."""
    with pytest.raises(PolicyError) as info:
        parse_policy(text, source="p.yaml")
    ((where, problem),) = info.value.problems
    assert where == line and message in problem
    assert "\n" not in str(info.value) and str(info.value).startswith(f"policy p.yaml:{line}: ")


def test_numbers_of_the_right_kind_still_load() -> None:
    policy = parse_policy("replay:\n  timeout_s: 60\ngate:\n  allow_aa_divergence: false\n").policy
    assert policy.replay.timeout_s == 60.0 and policy.gate.allow_aa_divergence is False


def test_an_empty_or_partial_policy_takes_the_shipped_defaults() -> None:
    """Before: an empty policy got min_prompts 20 (the code's own default), not the shipped 200."""
    default = load_policy("default").policy
    # min_context_tokens is the one key left out as 0 (no requirement), so a policy written for
    # a short corpus stays usable; the shipped default asks for the deployment's 200k.
    deployment = {"min_context_tokens": 200000}
    assert parse_policy("").policy.gate.model_copy(update=deployment) == default.gate
    assert parse_policy("").policy.gate.min_context_tokens == 0
    assert parse_policy("").policy.replay == default.replay
    assert default.gate.min_prompts == 200 and default.gate.min_context_tokens == 200000
    partial = parse_policy("gate:\n  min_prompts: 7\n").policy
    assert partial.gate.min_prompts == 7
    assert partial.replay == default.replay and partial.compare == default.compare
    assert partial.gate.model_copy(update={"min_prompts": 200, **deployment}) == default.gate


def test_the_shipped_default_policy_sets_every_key() -> None:
    """It is the one source of every default, so nothing may be left to the code."""
    from kdtree_parity.policy import Policy
    from kdtree_parity.yaml_load import load_yaml

    path = Path(__file__).resolve().parents[2] / (
        "services/parity/kdtree_parity/policies/default.yaml"
    )
    data = load_yaml(path.read_text())
    for section, model in Policy.model_fields.items():
        assert set(data[section]) == set(model.annotation.model_fields), section


def test_cli_policy_show_prints_the_effective_policy(tmp_path: Path) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text("gate:\n  min_prompts: 7\n")
    done = run_cli("policy", "--show", str(policy))
    assert done.returncode == 0, done.stderr
    from kdtree_parity.yaml_load import load_yaml

    shown = parse_policy(done.stdout).policy
    assert shown == parse_policy(policy.read_text()).policy
    assert load_yaml(done.stdout)["replay"]["concurrency"] == 8  # every key, default included
    assert run_cli("policy", "--show", "short").returncode == 0

    policy.write_text("gate:\n  max_logprob_drift_p99: .inf\n")
    for done in (
        run_cli("policy", "--show", str(policy)),
        run_cli("run", "--corpus", "short", "--policy", str(policy), "--db", str(tmp_path / "db")),
    ):
        assert done.returncode == 2
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and f"{policy}:2: gate.max_logprob_drift_p99" in lines[0], lines


def test_the_pairs_file_refuses_duplicate_keys(tmp_path: Path) -> None:
    from kdtree_parity.service import ConfigurationError, load_pairs

    pairs = tmp_path / "pairs.yaml"
    pairs.write_text(
        "gpu0:\n  baseline: http://a:1\n  candidate: http://c:1\n  candidate: http://evil:1\n"
    )
    with pytest.raises(ConfigurationError, match="duplicate key 'candidate'"):
        load_pairs(pairs)


def sglang_body(ids: list[int], top: int = 2) -> dict:
    return {
        "text": "xy",
        "output_ids": ids,
        "meta_info": {
            "id": "r",
            "finish_reason": {"type": "length", "length": len(ids)},
            "output_token_logprobs": [[-0.1 * (i + 1), t, chr(t)] for i, t in enumerate(ids)],
            "output_top_logprobs": [
                [[-0.1 * (i + 1), t, chr(t)], [-2.0, t + 1, None]][:top] for i, t in enumerate(ids)
            ],
        },
    }


def test_parses_sglang_generate_response() -> None:
    g = parse_generate_response(sglang_body([120, 121]))
    assert g.output_ids == (120, 121) and g.finish_reason == "length"
    assert g.token_logprobs == pytest.approx((-0.1, -0.2))
    assert g.token_texts == ("x", "y")
    assert g.top_map(1) == {121: pytest.approx(-0.2), 122: -2.0}
    assert g.top_map(5) is None
    from kdtree_parity.generation import Generation

    assert Generation.from_json(json.loads(json.dumps(g.to_json()))) == g


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda b: b.pop("output_ids"), "output_ids"),
        (lambda b: b.pop("meta_info"), "meta_info"),
        (lambda b: b["meta_info"].pop("output_token_logprobs"), "return_logprob"),
        (lambda b: b["meta_info"]["output_token_logprobs"].pop(), "1 output_token_logprobs for 2"),
        (lambda b: b["meta_info"]["output_token_logprobs"][0].__setitem__(1, 5), "is for token 5"),
        (lambda b: b["meta_info"].pop("output_top_logprobs"), "output_top_logprobs"),
        (lambda b: b["meta_info"]["output_top_logprobs"][0][0].__setitem__(0, "x"), "number"),
        (
            lambda b: b["meta_info"]["output_token_logprobs"][1].__setitem__(0, float("nan")),
            r"output_token_logprobs\[1\] logprob is nan",
        ),
        (
            lambda b: b["meta_info"]["output_top_logprobs"][0][1].__setitem__(0, float("inf")),
            r"output_top_logprobs\[0\]\[1\] logprob is inf",
        ),
    ],
)
def test_malformed_responses_are_named(mutate, message: str) -> None:
    body = sglang_body([120, 121])
    mutate(body)
    with pytest.raises(MalformedResponse, match=message):
        parse_generate_response(body)


def test_null_top_logprobs_position_is_kept_as_unknown() -> None:
    body = sglang_body([120, 121])
    body["meta_info"]["output_top_logprobs"][0] = None
    g = parse_generate_response(body)
    assert g.top_map(0) is None and g.top_map(1) is not None


def test_importing_kdtree_parity_does_not_import_torch() -> None:
    code = (
        "import sys, kdtree_parity.cli, kdtree_parity.service, kdtree_parity.runner, "
        "kdtree_parity.report; bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'sglang', 'kdtree_inference', 'kdtree_verify')); print(bad); "
        "sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kdtree_parity.cli", *args], capture_output=True, text=True
    )


def test_cli_refuses_bad_inputs_with_line_numbers_and_exit_2(tmp_path: Path) -> None:
    corpus = tmp_path / "bad.jsonl"
    corpus.write_text('{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n')
    done = run_cli(
        "run",
        "--baseline",
        "http://127.0.0.1:9",
        "--candidate",
        "http://127.0.0.1:10",
        "--corpus",
        str(corpus),
        "--policy",
        "short",
        "--db",
        str(tmp_path / "db"),
    )
    assert done.returncode == 2
    assert f"{corpus}:2: duplicate id 'a' (first on line 1)" in done.stderr

    policy = tmp_path / "bad.yaml"
    policy.write_text("gate:\n  min_prompts: 1\n  max_hard: 0\n")
    done = run_cli(
        "run", "--corpus", "short", "--policy", str(policy), "--db", str(tmp_path / "db")
    )
    assert done.returncode == 2 and f"{policy}:3: gate.max_hard" in done.stderr

    # A corpus smaller than the policy's min_prompts cannot decide anything: refused up front.
    done = run_cli("run", "--corpus", "short", "--policy", "default", "--db", str(tmp_path / "db"))
    assert done.returncode == 2 and "default.yaml needs 200" in done.stderr
    assert "no run" in run_cli("report", "nope", "--db", str(tmp_path / "db")).stderr


def test_cli_refuses_with_one_line_and_exit_2(tmp_path: Path) -> None:
    deep = tmp_path / "deep.jsonl"
    deep.write_bytes(b'{"id": "a", "text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n")
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"# caf\xe9\n")
    surrogate = tmp_path / "surrogate.jsonl"
    surrogate.write_bytes(b'{"id": "a", "text": "\\ud800"}\n')
    db = tmp_path / "db.sqlite3"
    for args, message in [
        (("--corpus", deep, "--policy", "short"), "invalid JSON: nested too deeply"),
        (("--corpus", "short", "--policy", latin), "not valid UTF-8"),
        (("--corpus", surrogate, "--policy", "short"), "lone surrogate"),
    ]:
        done = run_cli("run", *map(str, args), "--db", str(db))
        assert done.returncode == 2, done.stderr
        assert message in done.stderr and "Traceback" not in done.stderr
    # A resume is the stored run: targets, corpus, policy or out dir beside it are refused.
    done = run_cli(
        "run",
        "--resume",
        "r1",
        "--candidate",
        "http://127.0.0.1:9",
        "--policy",
        "short",
        "--db",
        str(db),
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "cannot resume r1 with --candidate, --policy: a resume replays the stored run's "
        "targets, corpus, policy and out dir; start a new run to change them"
    )
    # Read-only commands create nothing: a typo is not a new, empty database.
    for command in (("list",), ("report", "r1")):
        done = run_cli(*command, "--db", str(tmp_path / "typo" / "x.sqlite3"))
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
        assert "no run database at" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "typo").exists()
    junk = tmp_path / "junk.sqlite3"
    junk.write_text("a text file, not a database\n" * 50)
    done = run_cli("list", "--db", str(junk))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == f"cannot read the run database {junk}: file is not a database"


def test_cli_prints_the_report_schema() -> None:
    done = run_cli("schema")
    assert done.returncode == 0
    schema = json.loads(done.stdout)
    assert schema["title"] == "Report"
    assert {"verdict", "summary", "prompts", "corpus", "policy"} <= set(schema["properties"])


def test_parser_reads_what_sglang_0_5_23_builds() -> None:
    """meta_info built by SGLang's own TokenizerManager helpers, serialized as JSON, parses."""
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    class ByteTokenizer:  # what return_text_in_logprobs decodes with
        def batch_decode(self, ids: list[list[int]]) -> list[str]:
            return [chr(i[0]) for i in ids]

    manager = object.__new__(TokenizerManager)  # only the two pure helpers are used
    manager.tokenizer = ByteTokenizer()
    vals, idxs = [-0.25, -0.5, -0.125], [104, 105, 33]
    top_vals = [[-0.25, -2.0], [], [-0.125, -3.5]]
    top_idxs = [[104, 72], [], [33, 63]]
    for with_text in (True, False):
        meta = {
            "finish_reason": {"type": "stop", "matched": 33},
            "output_token_logprobs": manager.detokenize_logprob_tokens(vals, idxs, with_text),
            "output_top_logprobs": manager.detokenize_top_logprobs_tokens(
                top_vals, top_idxs, with_text
            ),
        }
        body = json.loads(json.dumps({"text": "hi!", "output_ids": idxs, "meta_info": meta}))
        g = parse_generate_response(body)
        assert g.output_ids == (104, 105, 33) and g.finish_reason == "stop"
        assert g.token_logprobs == (-0.25, -0.5, -0.125)
        assert g.token_texts == (("h", "i", "!") if with_text else (None, None, None))
        assert g.top_map(0) == {104: -0.25, 72: -2.0}
        assert g.top_map(1) is None  # SGLang sends null for a position without top-k
        assert g.top_map(2) == {33: -0.125, 63: -3.5}


def test_built_wheel_ships_corpora_policies_and_templates(tmp_path: Path) -> None:
    """After a plain (non-editable) install, the shipped names resolve and reports render."""
    import zipfile

    root = Path(__file__).resolve().parents[2]
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            str(root / "services" / "parity"),
            "-w",
            str(tmp_path / "wheel"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "wheel").glob("kdtree_parity-*.whl")
    zipfile.ZipFile(wheel).extractall(tmp_path / "site")
    code = (
        "import kdtree_parity, sys\n"
        "from kdtree_parity.corpus import load_corpus\n"
        "from kdtree_parity.policy import load_policy\n"
        "from kdtree_parity.report.html import _ENV\n"
        "assert kdtree_parity.__file__.startswith(sys.argv[1]), kdtree_parity.__file__\n"
        "print(len(load_corpus('default')), len(load_corpus('short')),\n"
        "      load_policy('default').policy.gate.min_prompts,\n"
        "      _ENV.get_template('report.html.j2').name)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "site")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path / "site")},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["203", "24", "200", "report.html.j2"]


def test_a_policy_reads_as_yaml_1_2() -> None:
    """Before (YAML 1.1): ``020`` was 16, ``1:00`` was 60 and ``on`` was true, so a policy ran
    with values other than the ones it shows."""
    from kdtree_parity.policy import PolicyError, parse_policy

    gate = parse_policy("gate:\n  min_prompts: 020\n").policy.gate
    assert gate.min_prompts == 20
    for text, where in (
        ("replay:\n  timeout_s: 1:00\n", "replay.timeout_s"),
        ("gate:\n  allow_aa_divergence: on\n", "gate.allow_aa_divergence"),
    ):
        with pytest.raises(PolicyError, match=rf"<policy>:2: {where}"):
            parse_policy(text)


def test_retry_delays_are_bounded() -> None:
    """Before: ``backoff_s`` and ``max_retry_delay_s`` had no upper bound, so one 502 with a huge
    backoff stalled the run for good."""
    from kdtree_parity.policy import PolicyError, parse_policy

    for key, value in (("backoff_s", 1e6), ("max_retry_delay_s", 86400)):
        with pytest.raises(PolicyError, match=rf"<policy>:2: replay\.{key}: .*less than"):
            parse_policy(f"replay:\n  {key}: {value}\n")


def test_corpus_lines_end_at_newlines_only_and_keys_are_unique() -> None:
    """Before: a prompt holding U+2028 or U+0085 was cut into two lines (two invalid entries),
    and a line naming "text" twice kept the last one silently."""
    separators = '{"id": "a", "text": "one\u2028two\u0085three"}\r\n{"id": "b", "text": "x"}\n'
    corpus = parse_corpus(separators.encode(), source="c.jsonl")
    assert [e.text for e in corpus.entries] == ["one\u2028two\u0085three", "x"]
    with pytest.raises(CorpusError, match=r"c\.jsonl:2: duplicate key 'text'"):
        parse_corpus(
            b'{"id": "a", "text": "x"}\n{"id": "b", "text": "y", "text": "z"}\n', "c.jsonl"
        )


def test_a_refused_out_dir_leaves_no_empty_folder(tmp_path: Path, monkeypatch) -> None:
    """Before: the folders made for the write check stayed behind when --out was refused."""
    from kdtree_parity.commands import run
    from kdtree_parity.commands.options import Refusal

    monkeypatch.setattr(run, "MIN_FREE_BYTES", 1 << 62)  # no disk has that much free
    out = tmp_path / "new" / "reports"
    with pytest.raises(Refusal, match="MiB free"):
        run.check_out_dir(str(out))
    assert list(tmp_path.iterdir()) == []
