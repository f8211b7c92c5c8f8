"""The client's commands of the ``trl-rapidfire`` command line (:mod:`trl_rapidfire.cli` adds
``expand``, which loads TRL: nothing here imports torch, TRL or the engine).

Commands:
  version                 print the versions of trl-rapidfire and the stack under it
  dashboard               start the MLflow UI on 127.0.0.1 for the store in use
  status                  a table of the runs of an experiment
  stop|resume|delete RUN  control ops (applied at the run's next chunk boundary, or at the
                          next train() of a finished experiment; else refused, with why)
  clone RUN --set K=V     a new run from RUN's knobs plus overrides (--warm: from its weights)
  report OUTPUT_DIR       PNG plots and a markdown summary of an experiment (--out DIR)
  doctor                  before a long run: the stack, devices, accelerate, disk, tracking

The op commands only set the run tag ``rapidfire.op``, exactly as the MLflow UI's tag editor
does; the training process applies it, removes it and writes ``rapidfire.op.result`` and
``rapidfire.op.seq``. Every error is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence

from .. import __version__
from .status import OP_CHARS

# A CLI call meets a tracking server that is down or hung with one clear line within seconds,
# not MLflow's default of retrying with backoff for minutes; and MLflow's INFO lines (schema
# creation) would make a one-line error three. Set unless the user set them.
_CLIENT_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5",
               "MLFLOW_LOGGING_LEVEL": "WARNING"}
_PROBE_TIMEOUT = 3.0
# Commands that need the tracking store to answer (a report falls back to the files).
_STORE_COMMANDS = frozenset({"status", "stop", "resume", "delete", "clone"})
_CLIENT_COMMANDS = _STORE_COMMANDS | {"report"}
# An op's text (an error can be hundreds of characters) as a status table shows it, so that
# every line of the table stays readable; --full shows it whole, ops.csv and the tags hold it.


def _cmd_version(_: argparse.Namespace) -> int:
    import importlib.metadata as md

    print(f"trl-rapidfire {__version__}")
    for dist in ("trl", "transformers", "peft", "torch", "accelerate", "datasets", "mlflow"):
        try:
            print(f"  {dist} {md.version(dist)}")
        except md.PackageNotFoundError:
            print(f"  {dist} (not installed)")
    return 0


def _where(args: argparse.Namespace) -> dict:
    return {"output_dir": args.output_dir, "experiment": args.experiment, "uri": args.uri}


def _check_store(uri: str, command: str) -> None:
    """A tracking server must answer ``/health`` within seconds; a sqlite store left
    half-created by a killed process is repaired as training would (or refused clearly)."""
    from .tracked_runs import sqlite_path, sqlite_ready

    db = sqlite_path(uri)
    if db is not None:
        # A store with the tables the CLI reads is read as it is (tracked_runs.py); one
        # without them is MLflow's to create or repair, at its cost of seconds.
        if db.is_file() and not sqlite_ready(db):
            import warnings

            from ..tracking.mlflow_store import ensure_schema

            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                ensure_schema(uri)
            for w in caught:
                if issubclass(w.category, RuntimeWarning):
                    text = str(w.message).removeprefix("trl-rapidfire: ")
                    print(f"trl-rapidfire {command}: warning: {text}", file=sys.stderr)
        return
    if not uri.startswith(("http://", "https://")):
        return
    import urllib.error

    from .deadlines import fetch_within

    try:  # within 3 s in all: a server trickling a byte every 2 s resets a socket timeout
        fetch_within(f"{uri.rstrip('/')}/health", _PROBE_TIMEOUT)
    except urllib.error.HTTPError:
        return  # it answers: MLflow's own calls say what is wrong (authentication, path)
    except (OSError, ValueError) as err:
        reason = getattr(err, "reason", None) or err
        raise ConnectionError(f"cannot reach the MLflow tracking server at {uri} ({reason}); "
                              "start it, or choose another store with --uri or "
                              "MLFLOW_TRACKING_URI") from None


@contextlib.contextmanager
def _client_limits() -> Iterator[None]:
    from ..tracking.mlflow_store import quiet_setup

    added = {k: v for k, v in _CLIENT_ENV.items() if k not in os.environ}
    os.environ.update(added)
    try:
        # MLFLOW_LOGGING_LEVEL (above) quiets an MLflow imported later; this one, one imported
        # already.
        with quiet_setup(import_mlflow=False):
            yield
    finally:  # main() may run inside another program (tests): leave its state as it was
        for key in added:
            os.environ.pop(key, None)


def _expected_errors() -> tuple[type[BaseException], ...]:
    """What a bad call, a bad file or an unusable store raises: one line, exit 2. Anything
    else is a bug and keeps its traceback."""
    import sqlite3

    import yaml

    from ..shared_state.store import StoreError
    from ..tracking.tracker import TrackingStoreError

    # sqlite3.Error: a local store locked past the timeout, or not a database (tracked_runs).
    kinds: list[type[BaseException]] = [ValueError, LookupError, OSError, yaml.YAMLError,
                                        StoreError, TrackingStoreError, sqlite3.Error]
    if "mlflow" in sys.modules:  # only imported once a command used it
        from mlflow.exceptions import MlflowException

        kinds.append(MlflowException)
    if "sqlalchemy" in sys.modules:
        import sqlalchemy.exc

        kinds.append(sqlalchemy.exc.SQLAlchemyError)
    return tuple(kinds)


def _one_line(err: BaseException) -> str:
    import yaml

    if isinstance(err, yaml.MarkedYAMLError):
        mark = err.problem_mark or err.context_mark
        where = f" {mark.name}, line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        text = f"invalid YAML in{where}: {err.problem or err.context or err}"
        if "python/" in text:
            text += " (config files are plain YAML: Python tags are never loaded)"
        return text
    text = str(err).strip().strip('"') or type(err).__name__
    if type(err).__module__.split(".")[0] in ("mlflow", "sqlalchemy"):
        # Their messages go on with SQL statements and links: the first line says it.
        return text.splitlines()[0].strip()
    return " ".join(text.split())


def _untracked(args: argparse.Namespace) -> bool:
    """Whether the command names (--output-dir) an experiment MLflow does not track: it is
    reached through its folder (folder_control.py)."""
    if args.output_dir is None:
        return False
    from ..control.folder_control import is_untracked

    return is_untracked(args.output_dir)


def _cmd_status(args: argparse.Namespace) -> int:
    from .status import show_status

    return show_status(args.output_dir, full=args.full, untracked=_untracked(args),
                       where=_where(args), sort=args.sort, top=args.top)


def _cmd_op(args: argparse.Namespace) -> int:
    from ..storage.outside_text import NotJSON, loads
    from .send import deliver_op, replaced_warning

    if args.command == "clone":
        overrides = {}
        for item in args.set or []:
            key, sep, raw = item.partition("=")
            if not sep or not key:
                raise ValueError(f"--set takes KEY=VALUE, got {item!r}")
            try:
                overrides[key] = loads(raw, what=f"the value of --set {key}", max_depth=8)
            except NotJSON:
                overrides[key] = raw  # a bare word is a string
        op = f"{'clone-warm' if args.warm else 'clone'} {json.dumps(overrides)}"
    else:
        op = args.command
    sent = deliver_op(args.run, op, next_run=args.next_run, **_where(args))
    if sent.replaced is not None:
        print(f"warning: {replaced_warning(args.run, sent.replaced, op)}", file=sys.stderr)
    # Said only of an op that will be applied: one the experiment could not apply was
    # refused above (deliver_op), with why.
    if sent.run_id is None:  # a file in the experiment's inbox
        print(f"{args.run}: {op} left in {sent.target}; it applies {sent.applies} (its "
              f"answer: {os.path.join(str(sent.folder), 'ops.csv')}, and `trl-rapidfire "
              f"status --dir {sent.folder}`)")
    else:
        print(f"{args.run}: {op} sent to {sent.target}; it applies {sent.applies} (see "
              "`trl-rapidfire status`)")
    return 0


def _cmd_dashboard(args: argparse.Namespace) -> int:
    # The server, its signals and where it opens live in dashboard.py (no torch, mlflow lazily).
    from ..tracking.tags import resolve_tracking_uri
    from .dashboard import serve

    # No store, a port taken, a server that died before answering: LookupError or OSError,
    # which main() says in one line.
    return serve(args.uri or resolve_tracking_uri(), args.port, create=args.create,
                 verbose=args.verbose)


def _cmd_report(args: argparse.Namespace) -> int:
    from ..reports.plots import write_report

    files = write_report(args.output_dir, args.out, metric=args.metric, tracking_uri=args.uri,
                         experiment=args.experiment)
    print(f"metrics from {files.source_detail}")
    for path in files.paths:
        print(path)
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import main as doctor  # torch only in its probe subprocess

    return doctor(args)


def _add_where(p: argparse.ArgumentParser, *, op: bool = False) -> None:
    default = ("the experiment training in the store" if op else
               "the experiment training in the store, else the latest")
    p.add_argument("--output-dir", "--dir", dest="output_dir",
                   help=f"the experiment's output_dir (default: {default})")
    p.add_argument("--experiment", help="MLflow experiment name (the one of that name that is "
                   "training, else its latest)")
    p.add_argument("--uri", help="tracking URI (default: MLFLOW_TRACKING_URI or ./mlflow.db)")
    if op:
        p.add_argument("--next-run", action="store_true",
                       help="send the op to an experiment that is not training: the "
                       "script's next train() applies it (one it could not apply is refused "
                       "now)")


# Adds commands to the command line's subparsers (what a layer above the client contributes).
CommandRegistrar = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]


def build_parser(extra: Sequence[CommandRegistrar] = ()) -> argparse.ArgumentParser:
    """The client's commands, plus those each of ``extra`` adds (see :mod:`trl_rapidfire.cli`:
    ``expand`` loads TRL, which the client never imports)."""
    parser = argparse.ArgumentParser(
        prog="trl-rapidfire",
        description="Hyperparallel TRL fine-tuning: compare many configs at once, chunk by chunk.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("version", help="print the versions of trl-rapidfire and its stack")
    p.set_defaults(func=_cmd_version)


    p = sub.add_parser(
        "dashboard", help="start the MLflow UI on 127.0.0.1 for the store in use",
        description="Serve the MLflow UI for the store on 127.0.0.1:PORT and print the URL of "
        "the newest experiment's runs table (Model training mode, runs listed flat with their "
        "status). Stops the server and all it started on Ctrl-C, SIGTERM or SIGHUP. A local "
        "store that does not exist is refused unless --create.",
    )
    p.add_argument("--port", type=int, default=5000)
    p.add_argument("--uri", help="tracking URI (default: MLFLOW_TRACKING_URI or ./mlflow.db)")
    p.add_argument("--create", action="store_true",
                   help="start an empty store when there is none (without it, a missing "
                   "store is an error, so a dashboard started in the wrong folder says so)")
    p.add_argument("--verbose", action="store_true",
                   help="also print the server's access log (a line per HTTP request) and "
                   "its start-up lines and notices")
    p.set_defaults(func=_cmd_dashboard)
    p = sub.add_parser("status", help="a table of the runs of an experiment")
    # The folder positionally too, as `report OUTPUT_DIR` takes it (main() merges the two).
    p.add_argument("folder", nargs="?", metavar="OUTPUT_DIR",
                   help="the experiment's output_dir (the same as --output-dir)")
    _add_where(p)
    p.add_argument("--full", action="store_true",
                   help=f"op texts whole (by default cut to {OP_CHARS} characters) and every "
                   "knob that differs between the runs, values whole")
    p.add_argument("--sort", metavar="METRIC",
                   help="sort the runs by this logged metric, best first (lower is better for "
                   "names ending in loss, else higher; `run`: in run order); default: the "
                   "experiment's ranking metric (its policy's, else metric_for_best_model, "
                   "else eval_loss or loss)")
    p.add_argument("--top", type=int, metavar="K", help="only the first K runs")
    p.set_defaults(func=_cmd_status)
    for verb, text in (("stop", "stop RUN (state kept, resumable)"),
                       ("resume", "put a stopped RUN back into the rotation"),
                       ("delete", "remove RUN for good")):
        p = sub.add_parser(verb, help=text)
        p.add_argument("run")
        _add_where(p, op=True)
        p.set_defaults(func=_cmd_op)
    p = sub.add_parser("clone", help="a new run from RUN's knobs plus --set overrides")
    p.add_argument("run")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help='a knob override; VALUE is JSON (1e-4, "cosine", {"candidate": 1}) '
                   "or a bare word; dotted keys set fields: peft_config.r=32")
    p.add_argument("--warm", action="store_true", help="start from RUN's weights")
    _add_where(p, op=True)
    p.set_defaults(func=_cmd_op)
    p = sub.add_parser(
        "report",
        help="PNG plots and a markdown summary of an experiment",
        description="Write learning_curves.png (the runs' curves, with the control ops marked), "
        "schedule.png (which run trained on which worker when) and summary.md (the runs "
        "ranked by --metric) into --out. Metrics come from MLflow when the experiment was "
        "tracked, else from the runs' trainer_state.json files.",
    )
    p.add_argument("output_dir", metavar="OUTPUT_DIR", help="the experiment's output_dir")
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write the report to")
    p.add_argument("--metric",
                   help="metric to plot and rank by (default: the experiment's ranking metric, "
                   "as status and the panel rank by; else eval_loss; lower is better for "
                   "names ending in loss, else higher); two, comma-separated (e.g. "
                   "eval_loss,eval_accuracy), also draw their Pareto front (pareto.png) and "
                   "rank by the first")
    p.add_argument("--experiment", help="MLflow experiment name (default: "
                   "MLFLOW_EXPERIMENT_NAME or the base name of OUTPUT_DIR)")
    p.add_argument("--uri", help="tracking URI (default: MLFLOW_TRACKING_URI or ./mlflow.db)")
    p.set_defaults(func=_cmd_report)
    p = sub.add_parser(
        "doctor", help="what to know before a long run, with a fix for each problem",
        description="Check the stack's versions against the tested ones, the devices torch "
        "sees, how many workers `accelerate launch` would start, free disk and /dev/shm, and "
        "whether the tracking store answers. Exit code 1 when a problem is found.",
    )
    p.add_argument("--output-dir", "--dir", dest="output_dir", metavar="DIR",
                   help="where the experiment will write (its free disk is checked; default: .)")
    p.set_defaults(func=_cmd_doctor)
    for register in extra:
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None, *,
         extra: Sequence[CommandRegistrar] = ()) -> int:
    """Run one command of the client (and of ``extra``, see :func:`build_parser`): its exit
    code. The ``trl-rapidfire`` console script is :func:`trl_rapidfire.cli.main`."""
    parser = build_parser(extra)
    args, rest = parser.parse_known_args(argv)
    if getattr(args, "command", None) is None:
        parser.print_help()
        return 0
    if rest and not getattr(args, "takes_overrides", False):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    args.overrides = rest
    folder = getattr(args, "folder", None)
    if folder is not None:
        if args.output_dir is not None and args.output_dir != folder:
            parser.error(f"two folders given: {folder} and --output-dir {args.output_dir}")
        args.output_dir = folder
    try:
        # Not for `dashboard`: the server it starts keeps MLflow's own settings.
        limits = _client_limits() if args.command in _CLIENT_COMMANDS else contextlib.nullcontext()
        with limits:
            if args.command in _STORE_COMMANDS:
                from ..tracking.tags import resolve_tracking_uri

                _check_store(args.uri or resolve_tracking_uri(), args.command)
            return args.func(args)
    except Exception as err:
        if not isinstance(err, _expected_errors()):
            raise
        print(f"trl-rapidfire {args.command}: error: {_one_line(err)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
