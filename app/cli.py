"""`bertology`: the command line of the workbench.

The CLI sits in `app/` because it is, like the Streamlit pages, a user-facing layer on top of both
`workbench/` (data, training, model handle, results) and `probes/`; keeping it here preserves the
one-way flow workbench -> probes -> app. Heavy modules are imported inside each command so that
`bertology --help` answers instantly.

`bertology --quiet COMMAND` (or `--quiet` after any command) turns off progress and info messages
(`workbench.progress`); warnings, errors and what the command prints as its result remain.

Every command exits 0 on success, 2 on a user-facing error (bad input, missing data, corrupt
checkpoint: one clear line on stderr naming the file), 1 on anything unexpected.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from workbench.errors import cli_errors


# --------------------------------------------------------------------------- data
def _cmd_data_verify(args: argparse.Namespace) -> int:
    from workbench.data.mirror import verify
    from workbench.paths import data_root

    root = Path(args.root) if args.root else data_root()
    report = verify(root, progress=not args.quiet)
    print(report.summary())
    return 0 if report.ok else 2


def _cmd_data_fetch(args: argparse.Namespace) -> int:
    from workbench.data.mirror import fetch
    from workbench.paths import data_root

    root = Path(args.root) if args.root else data_root(required=False)
    report = fetch(args.source, root, progress=not args.quiet)
    print(report.summary())
    return 0 if report.ok else 2


def _cmd_data_corpus(args: argparse.Namespace) -> int:
    from workbench.data.corpus import build_corpus, default_pretraining_sources

    sources = args.sources.split(",") if args.sources else default_pretraining_sources()
    split = build_corpus(sources, args.out, heldout_fraction=args.heldout_fraction, seed=args.seed,
                         max_documents=args.max_documents)
    counts = split.manifest.get("counts", {})
    print(f"corpus written to {split.dir} (manifest.json records every document's split)")
    for name in ("train", "heldout"):
        c = counts.get(name, {})
        print(f"  {name}: {c.get('documents', 0):,} documents, {c.get('words', 0):,} words")
    return 0


# --------------------------------------------------------------------------- probe
def _cmd_probe(args: argparse.Namespace) -> int:
    from probes import describe
    from probes.core.runner import cli_main

    if args.probe in (None, "-h", "--help"):
        usage = "usage: bertology probe NAME [options]   (bertology probe NAME --help for its options)\n\n" + describe()
        if args.probe is None:
            print(usage, file=sys.stderr)
            return 2
        print(usage)
        raise SystemExit(0)
    return cli_main(args.probe, args.probe_args, render_figures=_render_run_figures)


def _render_run_figures(names: list[str], run_id: str, store) -> None:
    from app.figures import render

    for name in names:
        r = render(name, store, store.root / "figures" / f"{name}-{run_id}", run_id=run_id)
        print(f"figure {name}: {r.folder} ({', '.join(p.name for p in r.files)})")


# --------------------------------------------------------------------------- run
def _cmd_run(args: argparse.Namespace) -> int:
    from app.experiments import run_experiment
    from workbench.drivers.executor import options_from_args

    return run_experiment(args.config, quick=args.quick, executor=options_from_args(args),
                          runs_root=args.runs_root, precision=args.precision) or 0


# --------------------------------------------------------------------------- reproduce
def _cmd_reproduce(args: argparse.Namespace) -> int:
    from app.reproduce.report import FAILED, format_outcomes, latest_folder, reproduce, write
    from workbench.drivers.executor import options_from_args
    from workbench.store.results import ResultsStore

    keys = [k.strip() for k in args.rows.split(",") if k.strip()] if args.rows else None
    options = options_from_args(args)  # bad --jobs / --executor: one line, before any work
    store = ResultsStore(args.runs_root) if args.runs_root else None
    outcomes = reproduce(keys, full=args.full, quick=args.quick, strict=args.strict, store=store,
                         threads=args.threads, progress=not args.quiet, executor=options)
    print(format_outcomes(outcomes), end="")
    command = "bertology " + " ".join(sys.argv[1:]) if sys.argv[1:] else "bertology reproduce"
    root = store.root if store is not None else ResultsStore().root
    write(outcomes, latest_folder(root, args.quick), command, args.quick, png=False)  # the app's page reads it
    if args.out:
        for path in write(outcomes, Path(args.out), command, args.quick):
            print(f"wrote {path}")
    return 1 if any(o.verdict.status == FAILED for o in outcomes) else 0


# --------------------------------------------------------------------------- drivers
def _cmd_driver(args: argparse.Namespace) -> int:
    """`bertology <driver> [CONFIG] [flags]` for every driver with a command in the registry
    (`workbench.drivers.spec.DRIVERS`): each flag an override of the config, then the driver's
    load (validation before any work), run (through the executor) and report (`run_command`)."""
    from workbench.drivers.spec import run_command

    print(run_command(args.command, args))
    return 0


def _add_driver_commands(sub) -> None:
    """One subcommand per driver with a command in the registry, flags and all (no torch import)."""
    from workbench.drivers.spec import DRIVERS, add_command_arguments

    for name, reg in DRIVERS.items():
        if reg.command is None:
            continue
        p = sub.add_parser(name, help=reg.description)
        add_command_arguments(p, name)
        p.set_defaults(func=_cmd_driver)


# --------------------------------------------------------------------------- runs
def _store(args: argparse.Namespace):
    from workbench.store.results import ResultsStore

    return ResultsStore(args.runs_root)


def _cmd_runs_list(args: argparse.Namespace) -> int:
    from workbench.store.results import format_runs

    filters = {k: v for k, v in (("kind", args.kind), ("model", args.model), ("probe", args.probe),
                                 ("task", args.task)) if v}
    print(format_runs(_store(args).runs(include_running=args.running, **filters)))
    return 0


def _cmd_runs_show(args: argparse.Namespace) -> int:
    from workbench.store.results import format_manifest, format_rows

    store = _store(args)
    print(format_manifest(store.manifest(args.run_id)))
    if not args.manifest_only:
        print(format_rows(store.read(args.run_id)))
    return 0


def _cmd_runs_delete(args: argparse.Namespace) -> int:
    _store(args).delete(args.run_id)
    print(f"deleted {args.run_id}")
    return 0


def _cmd_runs_gc(args: argparse.Namespace) -> int:
    print(_store(args).gc())
    return 0


def _cmd_runs_reindex(args: argparse.Namespace) -> int:
    print(_store(args).reindex())
    return 0


# --------------------------------------------------------------------------- activation cache
def _cmd_cache_list(args: argparse.Namespace) -> int:
    from workbench.activations import cache_entries

    entries = cache_entries(args.cache_dir)
    for e in entries:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.last_used))
        state = " (partial)" if e.partial else ""
        print(f"{e.bytes / 2**20:>10.1f} MB  {when}  {e.dataset_key}{state}  {e.path.name}")
    print(f"{len(entries)} entries, {sum(e.bytes for e in entries) / 2**30:.2f} GB (least recently used first)")
    return 0


def _cmd_cache_prune(args: argparse.Namespace) -> int:
    from workbench.activations import parse_size, prune_cache
    from workbench.errors import ConfigError

    if args.max_size is None and args.older_than_days is None:
        raise ConfigError("cache prune: give --max-size and/or --older-than-days")
    removed = prune_cache(parse_size(args.max_size) if args.max_size is not None else None,
                          args.older_than_days * 86400 if args.older_than_days is not None else None,
                          cache_dir=args.cache_dir, dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    for e in removed:
        print(f"{verb} {e.path.name} ({e.bytes / 2**20:.1f} MB, {e.dataset_key})")
    print(f"{verb} {len(removed)} entries, {sum(e.bytes for e in removed) / 2**30:.2f} GB")
    return 0


# --------------------------------------------------------------------------- app / figures
def _cmd_app(args: argparse.Namespace) -> int:
    """`streamlit run` of the app on the loopback, or exposed with `--host` behind a token and
    read-only unless `--allow-writes` (`app.access`: the token reaches Streamlit in its environment,
    never on its command line)."""
    import os
    import subprocess

    from app.access import serving
    from workbench.progress import get_logger

    served = serving(args.host, args.port, args.token, args.allow_writes)
    page = Path(__file__).with_name("streamlit_app.py")
    # the sidebar lists the app's pages whatever a user's .streamlit/config.toml says (issue 40);
    # Streamlit's own welcome lists a "Network URL" and, headless, looks up the machine's external
    # address on the internet: hidden, the URLs are printed here (with the token when there is one)
    cmd = [sys.executable, "-m", "streamlit", "run", str(page), "--server.port", str(args.port),
           "--server.address", served.address, "--server.headless", "true",
           "--client.showSidebarNavigation", "true", "--logger.hideWelcomeMessage", "true",
           "--browser.gatherUsageStats", "false"]
    env = {k: v for k, v in os.environ.items() if k not in served.env}
    env.update({k: v for k, v in served.env.items() if v is not None})
    if served.warning:
        get_logger(__name__).warning(served.warning)
    print("The app, once started: " + "  or  ".join(served.urls), flush=True)
    return subprocess.call(cmd, env=env)


def _cmd_figures(args: argparse.Namespace) -> int:
    from app.figures import figures_cli

    return figures_cli(args.names, args.all, args.out, args.formats, args.runs_root)


# --------------------------------------------------------------------------- cost
def _cmd_cost(args: argparse.Namespace) -> int:
    from workbench.cost import checkpoint_cost, cost_targets, dumps, format_cost_table
    from workbench.errors import ConfigError

    if args.grid is not None and not args.grid > 0:
        raise ConfigError(f"--grid: must be > 0 gCO2/kWh, got {args.grid}")
    folders = cost_targets(args.paths)
    if args.record:
        from workbench.cost import record_costs

        print(f"recorded run {record_costs(folders, name=args.name)} (probe cost) in the results store")
    if args.json:
        print(dumps({str(f): checkpoint_cost(f) for f in folders}))
    else:
        print(format_cost_table([str(f) for f in folders], grid=args.grid))
    return 0


# --------------------------------------------------------------------------- parser
QUIET_HELP = ("no progress bars or lines and no info messages; warnings, errors and the command's "
              "output (tables, JSON, run ids) still print")


class CommandParser(argparse.ArgumentParser):
    """The parser of every subcommand (and of theirs: argparse gives nested subparsers their
    parent's class): each accepts `--quiet`, so it need not be declared command by command.
    `default=SUPPRESS` leaves the top-level `bertology --quiet` value alone when it is not given."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.add_argument("--quiet", action="store_true", default=argparse.SUPPRESS, help=QUIET_HELP)


def build_parser() -> argparse.ArgumentParser:
    from workbench.drivers.executor import add_executor_arguments

    parser = argparse.ArgumentParser(prog="bertology", description=__doc__.splitlines()[0])
    parser.add_argument("--quiet", action="store_true", help=QUIET_HELP + " (also accepted after any command)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=CommandParser)

    data = sub.add_parser("data", help="verify, fetch and assemble data sets under the data root")
    data_sub = data.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    p = data_sub.add_parser("verify", help="check every data file against SHA256SUMS")
    p.add_argument("--root", help="data root (default: $BERTOLOGY_DATA or ../shared/data)")
    p.set_defaults(func=_cmd_data_verify)
    p = data_sub.add_parser("fetch", help="copy or download the data sets from a mirror, verifying checksums")
    p.add_argument("--from", dest="source", required=True, help="mirror folder or http(s)/file URL with SHA256SUMS")
    p.add_argument("--root", help="destination data root (default: $BERTOLOGY_DATA or ../shared/data)")
    p.set_defaults(func=_cmd_data_fetch)
    p = data_sub.add_parser("corpus", help="build a pretraining corpus with a recorded train/heldout split")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--sources", help="comma-separated corpus names (default: the English pretraining sources)")
    p.add_argument("--heldout-fraction", type=float, default=0.1, help="fraction of documents held out (default 0.1)")
    p.add_argument("--max-documents", type=int, help="cap on documents per source (quick experiments)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_cmd_data_corpus)

    p = sub.add_parser("probe", help="run a probe over checkpoints (bertology probe --help lists them)",
                       add_help=False)
    p.add_argument("probe", nargs="?", default=None, help="probe family (bertology probe --help lists them)")
    p.add_argument("probe_args", nargs=argparse.REMAINDER, help="arguments of the probe (try PROBE --help)")
    p.set_defaults(func=_cmd_probe)

    p = sub.add_parser("reproduce", help="the literature's headline findings beside ours: one table, one figure",
                       description="Run the reproduction rows (app/reproduce/rows.py) on the real models in the "
                                   "local Hugging Face cache, or on tiny models trained here (--quick), and print "
                                   "one table: the paper's number (quoted in app/reproduce/citations.yaml), ours "
                                   "with its 95%% CI, the stated test and the verdict it computes.")
    p.add_argument("--rows", default=None, help="comma-separated row keys (default: every default row)")
    p.add_argument("--full", action="store_true", help="add the long rows (hours on a CPU)")
    p.add_argument("--quick", action="store_true", help="every row's code path on tiny models trained here (minutes)")
    p.add_argument("--strict", action="store_true", help="refuse rows whose paper number is unverified")
    p.add_argument("--out", default=None, help="folder for the table (Markdown, CSV), the figure and a manifest")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--runs-root", default=None, help="runs root (default $BERTOLOGY_RUNS or ./runs)")
    add_executor_arguments(p, "rows")
    p.set_defaults(func=_cmd_reproduce)

    p = sub.add_parser("run", help="run an experiment YAML (train, probe, print the table)")
    p.add_argument("config", help="experiment YAML, e.g. experiments/main.yaml")
    p.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke test")
    add_executor_arguments(p, "runs")
    p.add_argument("--runs-root", default=None, help="runs root (default $BERTOLOGY_RUNS or ./runs)")
    p.add_argument("--precision", choices=("auto", "fp32", "bf16"), default=None,
                   help="training forward format (auto: bf16 on CUDA and on CPUs with amx_bf16/avx512_bf16)")
    p.set_defaults(func=_cmd_run)

    sub.add_parser("generate", help="generate text from a checkpoint (GPT, T5, BART, ELMo): bertology generate --help")

    _add_driver_commands(sub)  # train, finetune, distill, peft, prune, shadows: from the driver registry

    runs = sub.add_parser("runs", help="list, show and maintain runs in the results store")
    runs_sub = runs.add_subparsers(dest="runs_command", required=True, metavar="ACTION")
    root_opt = argparse.ArgumentParser(add_help=False)
    root_opt.add_argument("--root", dest="runs_root", help="runs root (default: $BERTOLOGY_RUNS or ./runs)")
    p = runs_sub.add_parser("list", parents=[root_opt], help="one line per run")
    for flag in ("kind", "model", "probe", "task"):
        p.add_argument(f"--{flag}", help=f"only runs with this {flag}")
    p.add_argument("--running", action="store_true", help="include runs still being written")
    p.set_defaults(func=_cmd_runs_list)
    p = runs_sub.add_parser("show", parents=[root_opt], help="what produced a run, then its rows")
    p.add_argument("run_id")
    p.add_argument("--manifest-only", action="store_true", help="print only the provenance")
    p.set_defaults(func=_cmd_runs_show)
    p = runs_sub.add_parser("delete", parents=[root_opt], help="delete a run")
    p.add_argument("run_id")
    p.set_defaults(func=_cmd_runs_delete)
    p = runs_sub.add_parser("gc", parents=[root_opt], help="remove leftovers of crashed writers")
    p.set_defaults(func=_cmd_runs_gc)
    p = runs_sub.add_parser("reindex", parents=[root_opt], help="rebuild the catalog from the run folders")
    p.set_defaults(func=_cmd_runs_reindex)

    cache = sub.add_parser("cache", help="list and prune the activation cache")
    cache_sub = cache.add_subparsers(dest="cache_command", required=True, metavar="ACTION")
    dir_opt = argparse.ArgumentParser(add_help=False)
    dir_opt.add_argument("--cache-dir", help="activation cache folder (default: <cache root>/activations)")
    p = cache_sub.add_parser("list", parents=[dir_opt], help="one line per entry, least recently used first")
    p.set_defaults(func=_cmd_cache_list)
    p = cache_sub.add_parser("prune", parents=[dir_opt], help="delete unused or least recently used entries")
    p.add_argument("--max-size", help="keep at most this much (e.g. 40G): least recently used entries go first")
    p.add_argument("--older-than-days", type=float, help="delete entries unused for this many days")
    p.add_argument("--dry-run", action="store_true", help="only say what would be removed")
    p.set_defaults(func=_cmd_cache_prune)

    p = sub.add_parser("app", help="open the Streamlit app on the runs root (on the loopback: --host to expose it)")
    p.add_argument("--port", type=int, default=8501)
    p.add_argument("--host", default="127.0.0.1",
                   help="IP address to listen on (default 127.0.0.1: this machine only); another one, e.g. 0.0.0.0, "
                        "exposes the app to the network behind a token, read-only")
    p.add_argument("--token", help="the token an exposed app asks for (default: $BERTOLOGY_APP_TOKEN, else a random "
                                   "one, printed in the URL)")
    p.add_argument("--allow-writes", action="store_true",
                   help="let an exposed app delete runs and generate text (off by default)")
    p.set_defaults(func=_cmd_app)

    p = sub.add_parser("cost", help="what checkpoints cost: FLOPs, device-hours, kWh, CO2e along the lineage")
    p.add_argument("paths", nargs="+", help="checkpoint, training folder (last step per seed) or fine-tuning run folder")
    p.add_argument("--grid", type=float, help="re-express CO2e at this grid intensity (gCO2/kWh)")
    p.add_argument("--json", action="store_true", help="the full cost records as JSON")
    p.add_argument("--record", action="store_true", help="also write them to the results store (figures, app)")
    p.add_argument("--name", help="run name with --record (default: cost)")
    p.set_defaults(func=_cmd_cost)

    p = sub.add_parser("figures", help="render figures (experiments/figures/*.yaml) from the results store")
    p.add_argument("names", nargs="*", help="figure names (experiments/figures/NAME.yaml) or YAML paths")
    p.add_argument("--all", action="store_true", help="draw every shipped figure whose data is in the store, then list "
                   "the others with the command that makes their data (exit 2 when any was skipped)")
    p.add_argument("--out", help="output folder (default <runs root>/figures/<name>/; several figures: OUT/<name>/)")
    p.add_argument("--formats", help="comma-separated subset of png,svg,pdf,html (default all)")
    p.add_argument("--runs-root", help="runs root (default $BERTOLOGY_RUNS or ./runs)")
    p.set_defaults(func=_cmd_figures)
    return parser


def _take_quiet(argv: list[str]) -> tuple[list[str], bool]:
    """`--quiet` for the commands whose options go to their own parser (generate, probe):
    the top-level `bertology --quiet COMMAND` form, and `--quiet` among the command's options (up to
    a `--`), which is taken out for generate (its parser does not know it) and left to
    probe's (where it also turns the probe's bars off)."""
    quiet = False
    while argv[:1] == ["--quiet"]:
        quiet, argv = True, argv[1:]
    if argv[:1] in (["generate"], ["probe"]):
        end = argv.index("--") if "--" in argv else len(argv)
        if "--quiet" in argv[1:end]:
            quiet = True
            if argv[0] != "probe":
                argv = [a for i, a in enumerate(argv) if not (a == "--quiet" and 0 < i < end)]
    return argv, quiet


def main(argv: list[str] | None = None) -> int:
    from workbench.progress import configure_logging, is_quiet

    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    argv, quiet = _take_quiet(argv)
    if argv[:1] == ["probe"] and len(argv) > 1:
        # every probe option goes to the probe's own parser, --help included
        args = argparse.Namespace(func=_cmd_probe, probe=argv[1], probe_args=argv[2:])
    elif argv[:1] == ["generate"]:  # its own parser (workbench.running.generate.cli_main), --help included
        from workbench.running.generate import cli_main as generate_main

        args = argparse.Namespace(func=lambda a: generate_main(argv[1:]))
    else:
        args = parser.parse_args(argv)
    # one logging set-up per command (workbench.progress); restored after, for callers of main() in-process
    was_quiet = is_quiet()
    configure_logging(quiet=True if quiet or getattr(args, "quiet", False) else None)  # None: BERTOLOGY_QUIET decides
    try:
        return cli_errors(lambda: args.func(args), "bertology")
    finally:
        configure_logging(quiet=was_quiet)


if __name__ == "__main__":
    sys.exit(main())
