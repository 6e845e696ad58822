"""The command line: --help on every command, and an end-to-end run on a tiny model."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import needs_smollm2

from topl_core.cli import build_parser, main
from topl_core.data.records import read_jsonl, write_jsonl


def _commands(parser) -> list[list[str]]:
    import argparse

    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out.append([name])
                out += [[name, *rest] for rest in _commands(sub)]
    return out


def test_every_command_has_help(capsys):
    commands = _commands(build_parser())
    assert {"data", "train", "generate", "score-tokens"} <= {c[0] for c in commands}
    for cmd in commands:
        with pytest.raises(SystemExit) as e:
            build_parser().parse_args([*cmd, "--help"])
        assert e.value.code == 0
        assert "usage:" in capsys.readouterr().out


def test_end_to_end_on_tiny_model(tmp_path, tiny_records, capsys):
    data = write_jsonl(tiny_records, tmp_path / "d.jsonl")
    assert main(["data", "inspect", str(data), "-n", "2"]) == 0
    assert "[[" in capsys.readouterr().out  # bad spans are marked
    run = tmp_path / "run"
    args = [
        "train",
        "--model",
        "tiny-llama",
        "--data",
        str(data),
        "--out",
        str(run),
        "--steps",
        "3",
        "--lora-layer-end",
        "2",
        "--batch-size",
        "4",
        "--precision",
        "fp32",
        "--eval-every",
        "3",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "step 3/3" in out and "finished" in out
    # the adapter names its base model as the workbench knows it, not the local folder it was loaded from
    assert json.loads((run / "adapter_config.json").read_text())["base_model_name_or_path"] == "tiny-llama"
    assert (
        main(
            [
                "generate",
                "--run",
                str(run),
                "--data",
                str(data),
                "--limit",
                "2",
                "--max-new-tokens",
                "4",
                "--out",
                str(tmp_path / "g.jsonl"),
            ]
        )
        == 0
    )
    assert len((tmp_path / "g.jsonl").read_text().splitlines()) >= 1
    assert (
        main(
            [
                "score-tokens",
                "--run",
                str(run),
                "--data",
                str(data),
                "--split",
                "all",
                "--limit",
                "6",
                "--json",
                str(tmp_path / "s.json"),
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    err = captured.err
    assert "precision: fp32 (auto" in err or "precision: bf16 (auto" in err  # the resolved precision is said
    assert "scoring" in err and "6/6 100%" in err  # long commands show progress (a log line when not a terminal)
    report = json.loads((tmp_path / "s.json").read_text())
    (row,) = report.values()
    assert row["records"] == 6 and 0 <= row["head_auroc"] <= 1
    # the model-free controls beside surprisal, on the same tokens, each with its interval (analysis/lexical.py)
    assert {"head", "surprisal", "lexical control", "new number or name", "position"} <= set(row["aurocs"])
    assert all(0 <= a["auroc"] <= 1 and {"ci_low", "ci_high"} <= set(a) for a in row["aurocs"].values())
    assert "lexical control" in captured.out
    assert (
        main(["score-tokens", "--run", str(run), "--document", "Leeds council met.", "--response", "Leeds met."]) == 0
    )


def test_cli_errors_are_clear(tmp_path, capsys):
    assert (
        main(
            ["train", "--model", "tiny-llama", "--data", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "r")]
        )
        == 2
    )
    assert "data build" in capsys.readouterr().err
    assert main(["train", "--model", "tiny-llama", "--lr", "-1", "--out", str(tmp_path / "r")]) == 2
    assert "lr=-1" in capsys.readouterr().err
    # flags a command would ignore are refused, not dropped
    assert main(["train", "--resume", str(tmp_path / "r"), "--steps", "9", "--lr", "0.1"]) == 2
    assert "--resume with --lr --steps" in capsys.readouterr().err
    assert main(["evaluate", "--run", str(tmp_path / "r"), "--model", "tiny-llama"]) == 2
    assert "--model tiny-llama with --run" in capsys.readouterr().err


def test_data_build_from_fava_jsonl(tmp_path):
    rows = [
        {
            "id": "f1",
            "evidence": "Paris is the capital of France.",
            "errored_passage": "The capital of France is <entity><mark>Lyon</mark><delete>Paris</delete></entity>.",
        }
    ]
    src = tmp_path / "fava.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows))
    assert main(["data", "build", "--source", "fava", "--input", str(src), "--out", str(tmp_path / "o.jsonl")]) == 0
    (rec,) = read_jsonl(tmp_path / "o.jsonl")
    assert rec.response == "The capital of France is Lyon." and rec.bad_texts == ["Lyon"]


def test_a_background_data_build_is_read_back_with_its_progress_and_what_it_said(tmp_path):
    """launch_data_build runs `data build` as a job (as the Data page does for a source a model writes);
    read_data_build reads back the file it writes, its last progress count and what it said after it."""
    from topl_core.data.sources import FILE_SOURCES, SourceOptions
    from topl_core.jobs import background, launchers

    out, job_dir = tmp_path / "p.jsonl", tmp_path / "jobs" / "p"
    launchers.launch_data_build(FILE_SOURCES["halueval-perturbed"], SourceOptions(limit=3), out, job_dir)
    assert background.wait(job_dir, timeout_s=300).state == "finished", background.log_tail(job_dir)
    build = launchers.read_data_build(job_dir)
    assert (build.source, build.out, build.done, build.total) == ("halueval-perturbed", out, 3, 3)
    assert build.said == (f"wrote {len(read_jsonl(out))} records to {out}",)


def test_listing_the_commands_does_not_load_the_core():
    """`python -m topl_core --help` (or a mistyped command) imports no command module, so no torch: it answers at
    once; naming a command loads that command's module alone."""
    import subprocess
    import sys

    probe = (
        "import sys; from topl_core.cli import build_parser\n"
        "try:\n    build_parser(sys.argv[1:]).parse_args(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('topl_core.cli.')), 'torch' in sys.modules)"
    )
    listing = subprocess.run([sys.executable, "-c", probe, "--help"], capture_output=True, text=True, check=True)
    assert listing.stdout.strip().endswith("[] False") and "label-sensitivity" in listing.stdout
    one = subprocess.run(
        [sys.executable, "-c", probe, "merge-check", "--help"], capture_output=True, text=True, check=True
    )
    loaded = one.stdout.strip().splitlines()[-1]
    assert "'topl_core.cli.merge_check'" in loaded and "'topl_core.cli.train'" not in loaded, loaded


PEFT_DEMO = Path(__file__).resolve().parents[1] / "examples" / "adapters" / "peft-sft-smollm2"


@needs_smollm2
@pytest.mark.skipif(not (PEFT_DEMO / "adapter_model.safetensors").exists(), reason="the plain-PEFT demo is missing")
def test_a_plain_peft_adapter_gives_its_heatmap_and_steering(capsys):
    """The SFT adapter trained by transformers + PEFT alone (scripts/train_plain_peft.py), on the embedded SmolLM2:
    `probe` prints its layer × module heatmap and `steer` its summaries, with no run directory anywhere."""
    small = ["--split", "val", "--limit", "6"]
    assert main(["probe", "--run", str(PEFT_DEMO), *small, "--n-boot", "20"]) == 0
    out = capsys.readouterr()
    assert "base smollm2-135m" in out.err and "method unknown" in out.err  # mapped from its hub base model name
    heatmap = out.out.split("LoRA-A AUROC mean ± std:")[1]
    rows = [line.split()[0] for line in heatmap.splitlines() if line.strip()[:2].strip().isdigit()]
    assert "down" in heatmap and rows == [str(i) for i in range(21)], heatmap  # layers 0–20, as it was trained
    doc = "The council approved the new budget on Monday after a long debate, the mayor said."
    args = ["steer", "--run", str(PEFT_DEMO), "--document", doc, "--lambdas", "0", "8", *small]
    assert main([*args, "--max-new-tokens", "12", "--no-base", "--top-k", "2"]) == 0
    out = capsys.readouterr().out
    assert "== merged, λ = 0" in out and "== merged, λ = 8" in out and "_proj" in out.split("steered sites")[1]


def test_train_without_out_writes_into_the_runs_folder(tmp_path, tiny_records, monkeypatch, capsys):
    """The default run directory lies in TOPL_RUNS_DIR (as the app's runs do), not in ./runs of the current folder."""
    data = write_jsonl(tiny_records, tmp_path / "d.jsonl")
    monkeypatch.setenv("TOPL_RUNS_DIR", str(tmp_path / "myruns"))
    args = ["train", "--model", "tiny-llama", "--data", str(data), "--steps", "1", "--lora-layer-end", "2"]
    assert main([*args, "--max-doc-tokens", "64", "--eval-every", "1"]) == 0
    assert (tmp_path / "myruns" / "topl-tiny-llama" / "adapter_model.safetensors").exists()


def test_job_launchers_write_the_command_lines_the_cli_reads(tmp_path):
    """The pages start evaluations through typed launchers (launchers.launch_evaluation / launch_translation /
    launch_data_build): the command line each writes, parsed by the real CLI parser, gives back the job's
    settings."""
    from topl_core.analysis.evaluation.config import EvalConfig, EvalJob, LambdaStudy
    from topl_core.analysis.evaluation.translation import TranslationConfig, TranslationJob
    from topl_core.analysis.studies.data_sources import SOURCES
    from topl_core.analysis.studies.own_summaries import OwnSummaryOptions
    from topl_core.cli import evaluate as evaluate_cli
    from topl_core.cli import evaluate_mt as evaluate_mt_cli
    from topl_core.cli.data import options_of
    from topl_core.foundations.presets import DEFAULT_MODEL
    from topl_core.jobs import launchers

    def parse(argv):
        return build_parser(argv).parse_args(argv)

    cfg = EvalConfig(n_id=3, n_ood=0, max_new_tokens=17, scorer="grounding", top_k=2, precision="fp32", batch_size=3)
    study = LambdaStudy((-1.0, 2.0), ("vector", "conditional"), "generated", ("ID",), (0.0, 1.0, 3.0))
    args = parse(launchers.evaluation_argv(EvalJob(cfg, ("runs/a", "runs/b"), study=study), tmp_path))
    assert evaluate_cli.config_from_args(args) == cfg
    assert args.run == ["runs/a", "runs/b"] and args.lambdas == [-1.0, 2.0] and args.modes == ["vector", "conditional"]
    assert args.positions == "generated" and args.sets == ["ID"] and args.scaled_lambdas == [0.0, 1.0, 3.0]
    assert Path(args.json) == tmp_path / "eval.json" and Path(args.csv) == tmp_path / "per_doc.csv"

    table = EvalJob(EvalConfig(n_id=2, n_ood=1, model="tiny-llama", precision="fp32"), include_base=True, steer=(2.0,))
    args = parse(launchers.evaluation_argv(table, tmp_path))
    assert evaluate_cli.config_from_args(args) == table.cfg and args.steer == [2.0] and not args.no_base
    assert args.lambdas is None and args.run == []
    with pytest.raises(ValueError, match="nothing to evaluate"):
        EvalJob(cfg, include_base=False)
    with pytest.raises(ValueError, match="mode"):
        LambdaStudy((1.0,), ("no-such-mode",))

    mt = TranslationJob(
        TranslationConfig("en-de", model="tiny-llama", precision="fp32", max_new_tokens=9),
        ("runs/a",),
        include_base=False,
        mlqe="mlqe/en-de",
        ood_src="src.txt",
        ood_ref="ref.txt",
        n_id=4,
        n_ood=5,
    )
    args = parse(launchers.translation_argv(mt, tmp_path))
    assert evaluate_mt_cli.config_from_args(args) == replace(mt.cfg, model=DEFAULT_MODEL)  # runs name their base
    assert (args.run, args.no_base, args.mlqe, args.ood_src, args.ood_ref) == (
        ["runs/a"],
        True,
        *["mlqe/en-de", "src.txt", "ref.txt"],
    )
    assert (args.n_id, args.n_ood) == (4, 5)

    # limit 600: SourceOptions' default, not this source's (240), so it must be spelled all the same
    own = OwnSummaryOptions(model="tiny-llama", limit=600, max_new_tokens=33)
    args = parse(launchers.data_build_argv(SOURCES["own-summaries"], own, tmp_path / "own.jsonl"))
    assert (args.source, args.out) == ("own-summaries", str(tmp_path / "own.jsonl"))
    assert options_of(args, SOURCES["own-summaries"]) == own
