"""``trl-rapidfire doctor``: the real command on this machine (its stack, devices, accelerate's
config, disk, tracking store), and each check on given inputs."""

from __future__ import annotations

import http.server
import importlib.metadata as md
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from mlflow_server import free_port

from trl_rapidfire.client import doctor
from trl_rapidfire.client.doctor import Devices, Finding

EXE = Path(sys.executable).with_name("trl-rapidfire")
NO_DEVICES = Devices()
NO_GPU = not (Path("/dev/nvidia0").exists() or os.environ.get("CUDA_VISIBLE_DEVICES"))


def _env(tmp_path: Path, uri: str, accelerate_yaml: str | None) -> dict[str, str]:
    """The environment of a run: accelerate's config under HF_HOME (the variable accelerate
    reads it by), the tracking store in MLFLOW_TRACKING_URI."""
    home = tmp_path / "hf"
    (home / "accelerate").mkdir(parents=True)
    if accelerate_yaml is not None:
        (home / "accelerate" / "default_config.yaml").write_text(accelerate_yaml)
    return dict(os.environ, HF_HOME=str(home), MLFLOW_TRACKING_URI=uri)


def _section(out: str, name: str) -> str:
    return out.split(f"\n{name}\n", 1)[1].split("\n\n", 1)[0]


@pytest.fixture(scope="module")
def sqlite_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """The console script, a sqlite store in a temporary folder, and an accelerate config
    asking for 2 processes with distributed_type NO (what starts one worker)."""
    tmp = tmp_path_factory.mktemp("doctor")
    env = _env(tmp, f"sqlite:///{tmp / 'mlflow.db'}", "distributed_type: 'NO'\nnum_processes: 2\n")
    proc = subprocess.run([str(EXE), "doctor"], cwd=tmp, env=env, capture_output=True,
                          text=True, timeout=120)
    return proc, tmp


def test_the_command_reports_the_installed_stack(sqlite_run):
    proc, _ = sqlite_run
    assert "Traceback" not in proc.stderr, proc.stderr
    stack = _section(proc.stdout, "stack")
    assert f"torch          {md.version('torch')}" in stack
    assert f"trl            {md.version('trl')}" in stack
    for dist in ("transformers", "peft", "datasets", "accelerate", "mlflow", "filelock"):
        assert f"   {dist}" in stack or f"!! {dist}" in stack, stack
    assert "python" in stack and f"trl-rapidfire  {md.version('trl-rapidfire')}" in stack


@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU")
def test_the_command_reports_no_cuda_and_the_cpus(sqlite_run):
    devices = _section(sqlite_run[0].stdout, "devices")
    assert "CUDA           not available, 0 GPUs" in devices
    assert f"CPUs           {os.cpu_count()}" in devices


def test_a_sqlite_store_in_a_writable_folder_is_reachable(sqlite_run):
    proc, tmp = sqlite_run
    tracking = _section(proc.stdout + "\n\n", "tracking")
    assert f"sqlite:///{tmp / 'mlflow.db'} (MLFLOW_TRACKING_URI)" in tracking
    assert f"reachable      yes, {tmp / 'mlflow.db'} is created by the first run" in tracking
    assert "!!" not in tracking


@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU")
def test_two_processes_without_multi_gpu_are_one_worker_and_the_fix_says_so(sqlite_run):
    proc, tmp = sqlite_run
    text = _section(proc.stdout, "accelerate")
    assert str(tmp / "hf" / "accelerate" / "default_config.yaml") in text
    assert "!! workers        1 per machine (NO, num_processes 2)" in text
    flat = " ".join(text.split())
    assert "starts ONE worker" in flat
    assert "fix: on CPU: OMP_NUM_THREADS=1 accelerate launch --multi_gpu --num_processes 2" in flat
    assert proc.returncode == 1  # a problem was found


def test_a_server_that_is_down_and_a_malformed_config_in_the_cli_process(tmp_path):
    """``main(["doctor"])`` as the console script runs it: never a traceback, and the CLI
    process itself never loads torch or the training stack (the probe is a subprocess)."""
    port = free_port()
    env = _env(tmp_path, f"http://user:secret@127.0.0.1:{port}", "distributed_type: [MULTI\n")
    code = ("import sys; from trl_rapidfire.cli import main; rc = main(['doctor']); "
            "print('LOADED', *[m for m in ('torch', 'trl', 'transformers', 'peft', 'accelerate')"
            " if m in sys.modules]); sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout.rstrip().splitlines()[-1] == "LOADED"
    assert proc.returncode == 1
    tracking = " ".join(_section(proc.stdout, "tracking").split())
    assert f"http://127.0.0.1:{port} (MLFLOW_TRACKING_URI)" in tracking
    assert "secret" not in proc.stdout and "user" not in tracking
    assert "!! reachable no: no answer" in tracking
    assert f"fix: start it (mlflow server --backend-store-uri sqlite:///mlflow.db --host " \
           f"127.0.0.1 --port {port})" in tracking
    accel = " ".join(_section(proc.stdout, "accelerate").split())
    assert "!! config" in accel and "not valid YAML (line 2, column 1)" in accel
    assert "fix: fix or remove it, or write a new one: accelerate config" in accel


def _check(tmp_path: Path, text: str | bytes, dev: Devices = NO_DEVICES) -> list[Finding]:
    path = tmp_path / "default_config.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return doctor.check_accelerate(path, dev)


def test_an_oversized_or_unreadable_config_is_refused_in_one_line(tmp_path):
    (big,) = _check(tmp_path, "a: b\n" * 20_000)
    assert big.problem == "97 KiB, over the 64 KiB an accelerate config can be: not read"
    (binary,) = _check(tmp_path, b"\xff\xfe\x00")
    assert binary.problem and "can't decode" in binary.problem and binary.fix
    (listed,) = _check(tmp_path, "- MULTI_GPU\n")
    assert listed.problem == "a YAML list, not the mapping accelerate reads"
    (missing,) = _check(tmp_path, "num_processes: 2\n")
    assert missing.problem and "distributed_type -" in missing.problem
    # Values of the wrong kind: refused in one line, never printed whole (an alias bomb is a
    # few hundred bytes of YAML and a string of billions of characters).
    bomb = "a: &a [x, x]\n" + "".join(f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}]\n" for p, c in
                                       zip("abcdefgh", "bcdefghi"))
    (nested,) = _check(tmp_path, bomb + "distributed_type: *i\nnum_processes: 2\n")
    assert nested.problem == "distributed_type is a YAML list, not text"
    (mpi,) = _check(tmp_path, "distributed_type: MULTI_CPU\nnum_processes: 2\nmpirun_config: x\n")
    assert mpi.problem == "mpirun_config is a YAML str, not a mapping"


def test_workers_by_config_and_gpus(tmp_path):
    two_gpus = Devices(cuda=True, gpus=(("H100", 80 * 2**30), ("H100", 80 * 2**30)))
    # Without CUDA, a MULTI_GPU config starts 2 workers through torchrun: no problem.
    _, ok = _check(tmp_path, "distributed_type: MULTI_GPU\nnum_processes: 2\n")
    assert ok.value.startswith("2 per machine") and ok.problem is None
    # An unquoted NO is YAML's false, which accelerate takes as NO: one worker.
    _, one = _check(tmp_path, "distributed_type: NO\nnum_processes: 2\n", two_gpus)
    assert one.problem and one.fix == ("accelerate launch --multi_gpu --num_processes 2 (or "
                                       "distributed_type: MULTI_GPU in the config)")
    _, mpi = _check(tmp_path, "distributed_type: MULTI_CPU\nnum_processes: 2\n")
    assert mpi.problem and "ONE worker" in mpi.problem
    _, idle = _check(tmp_path, "distributed_type: MULTI_GPU\nnum_processes: 1\n", two_gpus)
    assert idle.problem == "1 worker(s) for 2 GPU(s) on this machine"
    none, auto = doctor.check_accelerate(tmp_path / "absent.yaml", two_gpus)
    assert "none (looked for" in none.value and auto.value.startswith("2 ") and not auto.problem


def test_the_config_is_where_accelerate_looks():
    home = Path("~").expanduser()
    assert doctor.accelerate_config_path({"HF_HOME": "/h"}) == Path(
        "/h/accelerate/default_config.yaml")
    assert doctor.accelerate_config_path({"XDG_CACHE_HOME": "/x"}) == Path(
        "/x/huggingface/accelerate/default_config.yaml")
    assert doctor.accelerate_config_path({}) == home / ".cache/huggingface/accelerate/" \
        "default_config.yaml"


@pytest.mark.parametrize(("installed", "tested", "flagged"), [
    ("1.16.0", "==1.16.0", False), ("1.17.0", "==1.16.0", True), ("1.16.0rc1", "==1.16.0", True),
    ("2.13.0+cpu", "==2.13.0", False), ("2.5.1", ">=2.6", True), ("2.6.0", ">=2.6", False),
    ("3.11.7", ">=3.11", False), ("3.10.14", ">=3.11", True)])
def test_version_outside_the_tested_one(installed, tested, flagged):
    problem = doctor.version_problem(installed, tested)
    assert (problem == f"not the tested version ({tested})") if flagged else problem is None


def test_an_untested_version_is_flagged_with_its_fix():
    found = {f.label: f for f in doctor.check_stack({"trl": "==0.0.1", "torch": ">=2.6"})}
    assert found["trl"].problem == "not the tested version (==0.0.1)"
    assert found["trl"].fix == "pip install 'trl==0.0.1'"
    assert found["torch"].problem is None
    assert "cannot be compared" in (doctor.version_problem("not-a-version", "==1") or "")


def test_tested_versions_are_the_checkouts_pins_else_the_requirements(tmp_path):
    (tmp_path / "constraints.txt").write_text("# pins\ntrl==9.9.9\n\nPEFT==0.0.2  # note\n")
    assert doctor.tested_versions(tmp_path)["trl"] == ">=1.16.0"  # not a checkout: no pyproject
    (tmp_path / "pyproject.toml").write_text("")
    tested = doctor.tested_versions(tmp_path)
    assert tested["trl"] == "==9.9.9" and tested["peft"] == "==0.0.2"
    assert tested["torch"] == ">=2.6"  # not pinned: the package's requirement
    assert doctor.tested_versions()["accelerate"] == "==1.15.0"  # this checkout's pin


def _fake_python(tmp_path: Path, body: str) -> str:
    exe = tmp_path / "python"
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(0o755)
    return str(exe)


def test_the_probe_says_why_it_could_not_answer(tmp_path):
    missing = doctor.probe_devices(_fake_python(
        tmp_path, "echo \"ModuleNotFoundError: No module named 'torch'\" >&2; exit 1"))
    assert missing.error == "torch is not installed"
    (cuda, _) = doctor.check_devices(missing)
    assert cuda.problem == "torch is not installed" and "pip install torch" in (cuda.fix or "")
    hung = doctor.probe_devices(_fake_python(tmp_path, "exec sleep 5"), timeout=0.5)
    assert hung.error == "importing torch took over 0 s"
    garbled = doctor.probe_devices(_fake_python(tmp_path, "echo not json"))
    assert garbled.error and "unreadable answer" in garbled.error
    gpus = doctor.probe_devices(_fake_python(
        tmp_path, """echo '{"cuda": true, "gpus": [["H100", 85899345920]]}'"""))
    assert gpus == Devices(cuda=True, gpus=(("H100", 85899345920),))
    assert [f.value for f in doctor.check_devices(gpus)][:2] == ["available, 1 GPU(s)",
                                                                "H100, 80.0 GiB"]


def test_low_disk_and_shm_are_problems_with_fixes(tmp_path, monkeypatch):
    ok = doctor.check_disk(tmp_path / "not" / "yet")
    assert ok[0].value.endswith(f"free in {tmp_path.resolve()}")
    monkeypatch.setattr(doctor, "MIN_FREE_DISK", 1 << 60)
    monkeypatch.setattr(doctor, "MIN_FREE_SHM", 1 << 60)
    disk, shm = doctor.check_disk(tmp_path, shm=tmp_path)
    assert disk.problem and "checkpoints" in disk.problem and "--output-dir" in (disk.fix or "")
    assert shm.problem and "--shm-size" in (shm.fix or "")
    assert doctor.check_disk(tmp_path, shm=tmp_path / "none")[1].value == "absent"


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        body = b"OK" if self.path == "/health" else b"no"
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_server_answering_ok_is_reachable_and_another_answer_is_not(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        _, up = doctor.check_tracking(url)
        assert up.value == "yes, /health says 'OK'" and up.problem is None
        _, other = doctor.check_tracking(url + "/prefix")
        assert other.value == "HTTP 404 at /health" and other.problem and other.fix
    finally:
        server.shutdown()
        server.server_close()


def test_local_stores_and_credentials(tmp_path):
    missing = tmp_path / "no" / "such"
    _, bad = doctor.check_tracking(f"sqlite:///{missing / 'mlflow.db'}")
    assert bad.value == "no" and bad.problem == f"cannot write {missing / 'mlflow.db'}"
    assert bad.fix and bad.fix.startswith(f"mkdir -p {missing} ")
    _, files = doctor.check_tracking(str(tmp_path / "mlruns"))
    assert files.value == f"yes, {tmp_path / 'mlruns'} is created by the first run"
    for bad in ("http://localhost:50OO", "http://localhost:99999"):  # what http.client refuses
        _, unreachable = doctor.check_tracking(bad)
        assert unreachable.value == "no" and "--port 5000" in unreachable.fix, bad
    assert doctor.redact("https://me:pw@host:5000/x?token=abc") == "https://host:5000/x?token=***"
    assert doctor.redact("sqlite:////a/b.db") == "sqlite:////a/b.db"


def test_render_marks_problems_and_main_exit_code(monkeypatch, capsys):
    clean = [Finding("stack", "trl", "1.16.0"), Finding("disk", "free disk", "1 GiB")]
    for name in ("check_stack", "check_devices", "check_disk", "check_tracking"):
        monkeypatch.setattr(doctor, name, lambda *_, **__: [])
    monkeypatch.setattr(doctor, "probe_devices", lambda: Devices())
    monkeypatch.setattr(doctor, "check_accelerate", lambda *_: clean)
    assert doctor.main() == 0
    assert capsys.readouterr().out.startswith("trl-rapidfire doctor: no problems\n")
    bad = [*clean, Finding("disk", "/dev/shm", "64 MiB free", "too little", "docker --shm-size")]
    monkeypatch.setattr(doctor, "check_accelerate", lambda *_: bad)
    assert doctor.main() == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "trl-rapidfire doctor: 1 problem"
    assert lines[-2:] == ["!! /dev/shm   64 MiB free: too little",
                          "              fix: docker --shm-size"]


# Issue 47, defect 3: outside text that is deep, not a file, absurd, not a store, or not text.

def _in_time(call, seconds: float = 10.0):
    """``call()``'s answer, failing (not hanging) when it blocks, as reading a FIFO does."""
    answer: list = []

    def run():
        try:
            answer.append((call(), None))
        except Exception as err:  # noqa: BLE001 (raised again in the test's thread)
            answer.append((None, err))

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert answer, f"still blocked after {seconds} s"
    value, err = answer[0]
    if err is not None:
        raise err
    return value


def test_a_deeply_nested_config_is_one_problem_line_not_a_recursion_error(tmp_path):
    (flow,) = _check(tmp_path, "[" * 20_000)  # 20 KB, under the 64 KiB limit
    assert flow.problem == "nests over 16 levels deep (line 1, column 17): not read"
    assert flow.fix == "fix or remove it, or write a new one: accelerate config"
    block = "".join(" " * i + f"k{i}:\n" for i in range(40)) + "distributed_type: NO\n"
    (indented,) = _check(tmp_path, block)
    assert indented.problem and indented.problem.startswith("nests over 16 levels deep")
    fsdp = "distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n  fsdp_version: 2\n"
    assert _check(tmp_path, fsdp)[1].value == "2 per machine (FSDP, num_processes 2)"


def test_a_folder_or_fifo_at_the_config_path_is_named_and_refused_without_blocking(tmp_path):
    folder, fifo = tmp_path / "folder.yaml", tmp_path / "fifo.yaml"
    folder.mkdir()
    os.mkfifo(fifo)
    (as_folder,) = doctor.check_accelerate(folder, NO_DEVICES)
    assert as_folder.value == str(folder)
    assert as_folder.problem == ("a folder, not a file: accelerate launch skips it and reads "
                                 "no config")
    assert as_folder.fix == "remove it, or write a config there: accelerate config"
    (as_fifo,) = _in_time(lambda: doctor.check_accelerate(fifo, NO_DEVICES))
    assert as_fifo.problem and as_fifo.problem.startswith("a FIFO (named pipe), not a file")
    with pytest.raises(ValueError, match="a FIFO"):  # a FIFO swapped in after the stat
        _in_time(lambda: doctor._read_head(fifo, 16))


def test_absurd_process_and_machine_counts_are_problems(tmp_path):
    _, huge = _check(tmp_path, f"distributed_type: MULTI_GPU\nnum_processes: {10**26}\n")
    assert huge.problem == (f"num_processes {10**26} over num_machines 1: more than 256 workers "
                            "per machine or 100,000 machines is not a count any machine or "
                            "cluster has")
    assert huge.fix and "accelerate config" in huge.fix
    _, machines = _check(tmp_path, "distributed_type: MULTI_GPU\nnum_processes: 2000000\n"
                                   "num_machines: 1000000\n")
    assert machines.problem and "100,000 machines" in machines.problem
    _, fine = _check(tmp_path, "distributed_type: MULTI_GPU\nnum_processes: 16\n"
                               "num_machines: 2\n")
    assert fine.problem is None and fine.value.startswith("8 per machine")
    (flag,) = _check(tmp_path, "distributed_type: MULTI_GPU\nnum_processes: true\n")
    assert flag.problem == ("distributed_type MULTI_GPU, num_processes a YAML bool, "
                            "num_machines 1: accelerate launch cannot use these")


def test_a_local_store_must_be_one_mlflow_can_use(tmp_path):
    import sqlite3

    secret = tmp_path / "shadow"
    secret.write_text("root:$6$salt$hash:19000:0:99999:7:::\n")
    _, as_files = doctor.check_tracking(f"file://{secret}")
    assert as_files.value == "no"
    assert as_files.problem == f"{secret} is a file, not the folder a file store is"
    _, as_db = doctor.check_tracking(f"sqlite:///{secret}")
    assert as_db.problem == f"{secret} is a file but not an sqlite database"
    db = tmp_path / "mlflow.db"
    sqlite3.connect(db).execute("create table t (x)").connection.close()
    _, ok_db = doctor.check_tracking(f"sqlite:///{db}")
    assert ok_db.value == f"yes, {db} exists" and ok_db.problem is None
    _, db_as_files = doctor.check_tracking(f"file://{db}")
    assert db_as_files.problem == f"{db} is an sqlite database, not the folder a file store is"
    assert db_as_files.fix == f"MLFLOW_TRACKING_URI=sqlite:///{db}"
    _, ok_folder = doctor.check_tracking(f"file://{tmp_path}")
    assert ok_folder.value == f"yes, {tmp_path} exists" and ok_folder.problem is None
    _, folder_db = doctor.check_tracking(f"sqlite:///{tmp_path}")
    assert folder_db.problem == f"{tmp_path} is a folder, not an sqlite database"
    os.mkfifo(fifo := tmp_path / "fifo.db")
    _, as_fifo = _in_time(lambda: doctor.check_tracking(f"sqlite:///{fifo}"))
    assert as_fifo.problem == f"{fifo} is a FIFO (named pipe), not an sqlite database"


@pytest.mark.parametrize("uri", ["javascript:alert(1)", "ftp://host/mlruns",
                                 "data:text/html,<b>x</b>", "http://[::1:5000"])
def test_a_uri_mlflow_would_not_use_is_refused(uri):
    store, reachable = doctor.check_tracking(uri, timeout=0.5)
    assert reachable.value == "no" and reachable.problem
    assert reachable.fix and reachable.fix.startswith("set MLFLOW_TRACKING_URI to http(s)://")
    assert "[::1" not in store.value  # an unreadable URI is not shown (it may hold a password)


@pytest.mark.parametrize("uri", ["databricks", "postgresql+psycopg2://u:pw@db/mlflow", "uc:x"])
def test_other_stores_mlflow_opens_are_not_refused(uri):
    store, reachable = doctor.check_tracking(uri)
    assert reachable.value == "not checked here" and reachable.problem is None
    assert "pw" not in store.value


def test_control_characters_from_the_yaml_or_the_uri_are_escaped_on_the_screen(tmp_path,
                                                                             monkeypatch):
    yaml_text = 'distributed_type: "\\e[2J\\0X\\nY\\u202e"\nnum_processes: 2\n'
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "javascript:\x1b]0;pwned\x07\nalert(1)")
    findings = [*_check(tmp_path, yaml_text),
                *doctor.check_tracking(os.environ["MLFLOW_TRACKING_URI"])]
    screen = doctor.render(findings, width=1000)
    assert not [c for c in screen if ord(c) < 32 and c != "\n" or c in "\x7f\u202e"]
    assert "(\\x1b[2J\\x00X\\nY\\u202e, num_processes 2)" in screen
    assert "javascript:\\x1b]0;pwned\\x07\\nalert(1) (MLFLOW_TRACKING_URI)" in screen
    assert len(screen.splitlines()) == 11  # title, blank, 2 sections of 4: none added by text
    assert doctor.printable("a" * 500, limit=10) == "aaaaaaaaaa... (500 characters, cut)"


def test_trainers_lists_the_rf_pairs_and_flags_a_trl_trainer_without_one(tmp_path):
    # The installed TRL: every trainer it exports has its RF pair.
    found = doctor.check_trainers()
    assert [f.label for f in found] == ["RF pairs"] and not any(f.problem for f in found)
    assert "RFKTOTrainer" in found[0].value and "RFDistillationTrainer" in found[0].value
    # A later TRL with a trainer this package does not wrap: named, with what to do.
    init = tmp_path / "__init__.py"
    init.write_text('_import_structure = {\n    "trainer": [\n        "DPOConfig",\n'
                    '        "DPOTrainer",\n        "XPOTrainer",\n        "SFTTrainer",\n    ],\n'
                    '    "models": ["PreTrainedModelWrapper"],\n}\n')
    pairs, missing = doctor.check_trainers(init)
    assert pairs.value == "RFSFTTrainer RFDPOTrainer"
    assert missing.value == "XPOTrainer" and missing.problem and "plain TRL" in missing.fix
    init.write_text("x" * 10)  # no table found: every pair is listed, nothing is flagged
    assert [f.label for f in doctor.check_trainers(init)] == ["RF pairs"]
