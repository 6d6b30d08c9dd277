"""Real Terminal-Bench checkouts as they ship: nested collections, malformed and unsupported tasks,
[environment.env], run_tests_in_same_shell, Dockerfiles that fail, flaky oracles, and the three
networks (build, agent, grading) on a local internal Docker network standing in for a registry.
Every fixture is built here from tests/fixtures or from scratch."""
import dataclasses
import os
import re
import shutil
import time
import uuid

import pytest

import env as E
import grading
import task_folders as T
import tasktool
from conftest import FIXTURE_TASKS


def _copy(name, dest):
    return shutil.copytree(FIXTURE_TASKS / name, dest)


# --- loading --------------------------------------------------------------------------------------

def test_nested_checkout_loads_recursively_and_skips_a_malformed_task(tmp_path, capsys):
    """Bugs: a folder of folders of tasks loaded as [] with no warning, and one malformed task made
    the whole checkout fail to load."""
    _copy("tb1-hello", tmp_path / "tb1" / "tb1-hello")
    _copy("tb2-partial", tmp_path / "harbor" / "nested" / "tb2-partial")
    broken = _copy("tb1-hello", tmp_path / "tb1" / "broken")
    (broken / "solution.sh").unlink()
    assert [t.name for t in T.load_tasks(tmp_path)] == ["tb2-partial", "tb1-hello"]  # harbor/ < tb1/
    err = capsys.readouterr().err.splitlines()
    assert [ln for ln in err if ln.startswith("skipping task:")] == [
        f"skipping task: {broken / 'solution.sh'}: missing (the oracle solution)"]
    assert "skipped 1 of 3 tasks" in err[-1]
    with pytest.raises(T.TaskError, match="solution.sh"):
        T.load_tasks(tmp_path, strict=True)


def test_empty_checkout_is_an_error_naming_where_it_looked(tmp_path):
    """Bug: a checkout with no task (a wrong path) loaded as [] and training started on nothing."""
    (tmp_path / "docs").mkdir()
    with pytest.raises(T.TaskError, match=f"no task found .*{tmp_path}"):
        T.load_tasks(tmp_path)


COMPOSE_TWO = "services:\n  client:\n    build: .\n  db:\n    image: postgres\n"


@pytest.mark.parametrize("fixture,where,text,refused", [
    ("tb1-hello", "docker-compose.yaml", COMPOSE_TWO, "multi-container"),
    ("tb1-hello", "docker-compose.yaml", "services:\n  client:\n    build: .\n", None),  # TB1's usual one
    ("tb2-partial", "environment/docker-compose.yaml", COMPOSE_TWO, "multi-container"),
    ("tb2-partial", "task.toml+", '[[steps]]\ninstruction = "step 2"\n', "multi-step"),
])
def test_formats_termrl_cannot_run_are_refused_at_load_time(tmp_path, fixture, where, text, refused):
    """Bug: multi-container and multi-step tasks loaded 'OK' and then ran wrong (one container, one step)."""
    d = _copy(fixture, tmp_path / fixture)
    if where.endswith("+"):
        (d / where[:-1]).write_text((d / where[:-1]).read_text() + text)
    else:
        (d / where).write_text(text)
    if refused is None:
        assert T.load_task(d).name == fixture
    else:
        with pytest.raises(T.TaskError, match=refused):
            T.load_task(d)


def test_environment_env_and_tests_in_the_agents_shell(docker_env, tmp_path):
    """Bugs: Harbor's [environment.env] was ignored; TB1's run_tests_in_same_shell tests did not see
    what the agent exported (but must still not see a loader variable it set)."""
    d = _copy("tb2-partial", tmp_path / "tb2-env")
    (d / "task.toml").write_text((d / "task.toml").read_text() + '\n[environment.env]\nGREETING = "hi"\n')
    (d / "tests" / "test.sh").write_text('[ "$GREETING" = hi ] && echo 1 > /logs/verifier/reward.txt '
                                         '|| echo 0 > /logs/verifier/reward.txt\n')
    task = T.load_task(d)
    with docker_env.reset(task) as term:
        assert term.run("echo $GREETING").output == "hi\n"
        assert grading.grade(term).reward == 1.0
    d = _copy("tb1-hello", tmp_path / "tb1-shell")
    (d / "task.yaml").write_text((d / "task.yaml").read_text() + "run_tests_in_same_shell: true\n")
    (d / "run-tests.sh").write_text('echo "LD=${LD_PRELOAD:-unset}"; [ "$AGENT_VAR" = set ]\n')
    task = T.load_task(d)
    assert task.tests_in_agent_shell
    for exports, want in [("true", 0.0), ("export AGENT_VAR=set LD_PRELOAD=/x.so", 1.0)]:
        with docker_env.reset(task) as term:
            term.run(exports)
            g = grading.grade(term)
            assert (g.reward, g.tampered) == (want, None) and "LD=unset" in g.output, g


# --- validate ---------------------------------------------------------------------------------------

def test_task_dockerfile_that_fails_to_build_is_a_task_defect(docker_env, tmp_path):
    """Bug: a task's own Dockerfile that failed to build was reported as an infrastructure error."""
    d = _copy("tb1-hello", tmp_path / "bad-build")
    (d / "Dockerfile").write_text(f"FROM termrl-base:bookworm\nRUN echo step-{uuid.uuid4().hex} && "
                                  "echo the-build-log-tail && exit 3\n")
    row = tasktool.validate_task(docker_env, d, k=1)
    assert row["status"] == "build_fails" and "the-build-log-tail" in row["error"], row


def test_validate_reports_a_flake_rate_under_load(docker_env, tmp_path):
    """Bug: validate ran the oracle 3 times in a row, which a 1-in-10 flake passes 73% of the time;
    the flake runs report how often it fails under concurrent load."""
    d = _copy("tb1-hello", tmp_path / "coin")
    (d / "run-tests.sh").write_text("python3 -c 'import random, sys; sys.exit(random.random() < 0.5)'\n")
    row = tasktool.validate_task(docker_env, d, k=0, flake_runs=12, load=4)
    assert row["status"] == "flaky" and 0 < row["flake_rate"] < 1, row


# --- networks ---------------------------------------------------------------------------------------

@pytest.fixture
def registry():
    """An internal Docker network (no route outside) with an HTTP server on it named `registry`."""
    import docker
    client = docker.from_env()
    name = f"termrl-test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    net = client.networks.create(name, internal=True, labels={"termrl": "1"})
    srv = client.containers.run(
        "termrl-base:bookworm", ["bash", "-c", "mkdir -p /srv && echo pkg-ok > /srv/pkg.txt && cd /srv && "
                                 "exec python3 -m http.server 8000"],
        detach=True, network=name, labels={"termrl": "1"}, remove=True)
    try:
        net.disconnect(srv)
        net.connect(srv, aliases=["registry"])
        for _ in range(100):
            if srv.exec_run(["python3", "-c", "import urllib.request as u; "
                             "u.urlopen('http://localhost:8000/pkg.txt')"]).exit_code == 0:
                break
            time.sleep(0.1)
        yield name
    finally:
        srv.remove(force=True)
        net.remove()


FETCH = ("python3 -c \"import urllib.request as u; "
         "print(u.urlopen('http://registry:8000/pkg.txt', timeout=10).read().decode())\"")


def test_build_and_grading_reach_the_registry_the_agent_does_not(registry, tmp_path):
    """Bugs: builds and grading had no network unless the agent had it too, and a harness that could not
    download its runner scored a silent 0. Builds and grading now reach the (stand-in) registry; the
    agent stays offline unless the task and the Env both opt in; an offline harness is an infra error."""
    d = _copy("tb1-hello", tmp_path / "netted")
    (d / "Dockerfile").write_text(f"FROM termrl-base:bookworm\nWORKDIR /app\nRUN echo {uuid.uuid4().hex} && "
                                  f"{FETCH} > /built.txt\n")
    (d / "task.yaml").write_text((d / "task.yaml").read_text() + "tests_need_network: true\n")
    (d / "run-tests.sh").write_text(f'[ "$({FETCH})" = pkg-ok ] && [ "$(cat /built.txt)" = pkg-ok ]\n')
    task = T.load_task(d)
    with E.Env(build_network=registry, agent_network=registry, grading_network=registry) as env:
        try:
            with env.reset(task) as term:
                r = term.run(FETCH, timeout=30)
                assert r.exit_code != 0 and "pkg-ok" not in r.output, r.output  # task did not opt in
                g = grading.grade(term)
                assert (g.reward, g.infra_error) == (1.0, None), g.output
            with env.reset(dataclasses.replace(task, allow_internet=True)) as term:
                assert term.run(FETCH, timeout=30).output.strip() == "pkg-ok"  # task and Env opted in
        finally:
            image = env.image(task)
    with E.Env(build_network=registry, agent_network="none", grading_network="none") as env:
        with env.reset(dataclasses.replace(task, allow_internet=True)) as term:
            assert term.run(FETCH, timeout=30).exit_code != 0  # the Env keeps every agent offline
            g = grading.grade(term)
            assert g.reward is None and "could not install itself" in g.infra_error, g
        env.client.images.remove(image, force=True)


# --- as shipped: offline harnesses, hidden files in the image ---------------------------------------

APT_HARNESS = ("apt-get update; apt-get install -y --no-install-recommends curl-nonexistent-pkg; "
               "{ command -v curl-nonexistent-pkg && python3 -m pytest /tests; } || {}\n")


@pytest.mark.parametrize("fixture,script,fail", [
    ("tb1-hello", "run-tests.sh", "exit 1"),
    ("tb2-partial", "tests/test.sh", "echo 0 > /logs/verifier/reward.txt"),
])
def test_offline_harness_that_cannot_install_itself_is_infra_in_both_layouts(docker_env, tmp_path, fixture,
                                                                            script, fail):
    """Bug: a Harbor test.sh whose apt printed "Temporary failure resolving" and then wrote reward 0
    was a failure of the episode (for no test ran); it is the infrastructure's, as TB1's already was."""
    d = _copy(fixture, tmp_path / fixture)
    (d / script).write_text(APT_HARNESS.replace("{}", "{ " + fail + "; }"))
    with docker_env.reset(T.load_task(d)) as term:
        g = grading.grade(term)
    assert g.reward is None and "could not install itself" in g.infra_error, g


@pytest.mark.parametrize("fixture,dockerfile,line", [
    ("tb1-hello", "Dockerfile", "COPY tests/ /tests/"),
    ("tb1-hello", "Dockerfile", "COPY solution.sh /solution.sh"),
    ("tb2-partial", "environment/Dockerfile", "COPY ./tests /tests"),
    ("tb2-partial", "environment/Dockerfile", "ADD --chown=root solution/ /opt/solution"),
])
def test_dockerfile_that_copies_the_tests_or_the_solution_is_refused_at_load(tmp_path, fixture, dockerfile,
                                                                             line):
    """Bug: a Dockerfile that COPYs the tests or the solution loaded and then failed to build at episode
    time (they are not in the build context, where the agent could read them from the image)."""
    d = _copy(fixture, tmp_path / fixture)
    (d / dockerfile).write_text((d / dockerfile).read_text() + line + "\n")
    with pytest.raises(T.TaskError,
                       match=rf"{dockerfile}:\d+: {re.escape(line)}.*never built into the image"):
        T.load_task(d)


SERVE = "nohup setsid python3 -m http.server 8123 --bind 127.0.0.1 >/dev/null 2>&1 &\nsleep 1\n"
PROBE = ("python3 -c \"import urllib.request; urllib.request.urlopen('http://127.0.0.1:8123', timeout=5)\" "
         "&& echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n")


def test_a_task_whose_oracle_leaves_a_service_running_validates_as_shipped(docker_env, tmp_path):
    """Bug: a task whose oracle starts a web server its tests query (the QC fixture
    pass/webservice-healthcheck of terminal-bench-qc) failed validate: the sweep before grading killed
    the server ("Connection refused"). The server now stays up, the tests run beside it."""
    d = _copy("tb2-partial", tmp_path / "webservice")
    (d / "solution" / "solve.sh").write_text(SERVE)
    (d / "tests" / "test.sh").write_text(PROBE)
    row = tasktool.validate_task(docker_env, d, k=2)
    assert (row["status"], row["oracle"], row["noop"]) == ("ok", [1.0, 1.0], 0.0), row


# A server that records each connection in /app/hits: its tests read a file it writes while they run.
RECORDER = ("nohup setsid python3 -c \"import socket\n"
            "s = socket.socket(); s.bind(('127.0.0.1', 8126)); s.listen()\n"
            "while True:\n    s.accept()[0].close(); open('/app/hits', 'a').write('hit\\n')\""
            " >/dev/null 2>&1 &\nsleep 1\n")
RECORDED = ("python3 -c \"import socket, time; socket.create_connection(('127.0.0.1', 8126), 5); "
            "time.sleep(0.5)\"; "
            "grep -q hit /app/hits && echo 1 > /logs/verifier/reward.txt "
            "|| echo 0 > /logs/verifier/reward.txt\n")


def test_validate_names_a_task_whose_tests_read_what_its_service_writes(docker_env, tmp_path):
    """The one kind of service grading does not keep by default: tests that read a file the service
    writes while they run (they run in a copy of the container, not in the service's). Validate says
    so and what to set, instead of "oracle failed"; with keep_agent_processes the task is ok."""
    d = _copy("tb2-partial", tmp_path / "recorder")
    (d / "solution" / "solve.sh").write_text(RECORDER)
    (d / "tests" / "test.sh").write_text(RECORDED)
    row = tasktool.validate_task(docker_env, d, k=1)
    assert row["status"] == "needs_service" and "keep_agent_processes" in row["error"], row
    (d / "task.toml").write_text((d / "task.toml").read_text().replace(
        "[metadata]\n", "[metadata]\nkeep_agent_processes = true\n"))
    row = tasktool.validate_task(docker_env, d, k=1)
    assert row["status"] == "ok", row


# a Python backslash-newline splits the RUN line below: one line in the Dockerfile
ENTRY_DOCKERFILE = """FROM termrl-base:bookworm
RUN printf '#!/bin/bash\\nnohup python3 -m http.server 8124 --bind 127.0.0.1 \
>/dev/null 2>&1 &\\nexec "$@"\\n' \\
    > /entry.sh && chmod +x /entry.sh
ENTRYPOINT ["/entry.sh"]
WORKDIR /app
"""


@pytest.mark.parametrize("where", ["local", "remote"])
def test_image_entrypoint_runs_and_its_service_survives_grading(docker_env, tmp_path, where):
    """Bug: the image's ENTRYPOINT was silently replaced by `sleep infinity`, so a task whose entrypoint
    starts a server never had one. It runs as in Harbor (with `sleep infinity` as its command), and what
    it started before the agent's first command is the image's, not swept before grading: on a daemon
    on another machine too (bug: the kill from inside took the server with the agent's processes)."""
    d = _copy("tb2-partial", tmp_path / "entrypoint")
    (d / "environment" / "Dockerfile").write_text(ENTRY_DOCKERFILE)
    (d / "tests" / "test.sh").write_text(PROBE.replace("8123", "8124"))
    env = docker_env if where == "local" else E.Env(hosts=["unix:///var/run/docker.sock"])
    if where == "remote":  # what a daemon on another machine gets: no host-side /proc, cgroups or signals
        env._hosts.hosts[0].host_side = False
    with env.reset(T.load_task(d)) as term:
        assert term.local is (where == "local")
        probe = ("python3 -c \"import urllib.request; "
                 "urllib.request.urlopen('http://127.0.0.1:8124', timeout=5)\"")
        for _ in range(50):
            if term.run(probe, timeout=10).exit_code == 0:
                break
            time.sleep(0.1)
        assert term.run(probe, timeout=10).exit_code == 0
        term.run("sleep 1000 &")  # the agent's own process goes, the image's stays
        g = grading.grade(term)
        assert "sleep 1000" not in term.exec("ps -eo args")[1]
    if env is not docker_env:
        env.close()
    assert (g.reward, g.infra_error, g.tampered) == (1.0, None, None), g


# --- the task-quality classes of a public QC suite, written here: (Dockerfile lines, solution, tests) ---
QC_TEST_SH = ("#!/bin/bash\ncd /app\npython3 -m pytest /tests/test_outputs.py -q\n"
              "[ $? -eq 0 ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n")
QC_DATA = ("RUN mkdir -p /app/data /app/out && "
           "printf 'id,status\\n1,ok\\n2,void\\n3,ok\\n' > /app/data/records.csv\n")
QC_SOLVE = ("python3 -c \"import csv; rows = [r for r in csv.DictReader(open('/app/data/records.csv')) "
            "if r['status'] != 'void']; open('/app/out/kept.txt', 'w').write(str(len(rows)))\"\n")
QC_CLASSES = {  # class -> (verdict, Dockerfile lines, tests/test_outputs.py,
                # {extra tests/ files}, task.toml metadata)
    "outputs checked by the tests alone": (
        "ok", QC_DATA, "def test_kept():\n    assert open('/app/out/kept.txt').read() == '2'\n", {}, ""),
    "truth shipped with the tests": (
        "ok", QC_DATA, "def test_kept():\n    assert open('/app/out/kept.txt').read() == "
        "open('/tests/truth/kept.txt').read()\n", {"truth/kept.txt": "2"}, ""),
    "truth baked into the image": (
        "truth_in_reach", QC_DATA + "RUN echo -n 2 > /opt/answer_truth.txt\n",
        "def test_kept():\n    assert open('/app/out/kept.txt').read() == "
        "open('/opt/answer_truth.txt').read()\n", {}, ""),
    "grader in the image": (
        "truth_in_reach",
        QC_DATA + "RUN printf \"print('PASS' if open('/app/out/kept.txt').read() == '2' else 'FAIL')\" "
        "> /app/verify.py\n",
        "import subprocess\ndef test_kept():\n    assert 'PASS' in subprocess.run(['python3', "
        "'/app/verify.py'], capture_output=True, text=True).stdout\n", {}, ""),
    "an image input the task lists in tests_read_ok": (
        "ok", QC_DATA, "import csv\ndef test_kept():\n    n = sum(r['status'] != 'void' for r in "
        "csv.DictReader(open('/app/data/records.csv')))\n"
        "    assert open('/app/out/kept.txt').read() == str(n)\n", {},
        'tests_read_ok = ["/app/data/*.csv"]\n'),
    "the same input, not listed": (
        "truth_in_reach", QC_DATA, "import csv\ndef test_kept():\n    n = sum(r['status'] != 'void' for r in "
        "csv.DictReader(open('/app/data/records.csv')))\n"
        "    assert open('/app/out/kept.txt').read() == str(n)\n", {}, ""),
    "unconditional reward": (
        "noop_passes", QC_DATA, "def test_kept():\n    assert open('/app/out/kept.txt').read() == '2'\n",
        {"test.sh": "#!/bin/bash\npython3 -m pytest /tests/test_outputs.py -q || true\n"
                    "echo 1 > /logs/verifier/reward.txt\n"}, ""),
    "solution copied into the image": (
        "malformed", QC_DATA + "COPY solution/ /app/solution/\n", "def test_kept():\n    pass\n", {}, ""),
}


@pytest.mark.parametrize("kind", list(QC_CLASSES))
def test_task_quality_classes_validate_with_their_verdicts(docker_env, tmp_path, kind):
    """Bug: a task whose tests compare against a truth file baked into the image, or run a grader the
    image ships, validated ok: the agent can rewrite either, so its reward can be forged. validate
    watches what the oracle's tests read and names each such file (truth_in_reach)."""
    verdict, docker_lines, test_py, extra, meta = QC_CLASSES[kind]
    d = tmp_path / "task"
    for rel, text in {"environment/Dockerfile": ("FROM termrl-base:bookworm\n" + docker_lines
                                                 + "WORKDIR /app\n"),
                      "instruction.md": "Count the rows of /app/data/records.csv whose status is not void; "
                                        "write the count to /app/out/kept.txt.\n",
                      "solution/solve.sh": "#!/bin/bash\n" + QC_SOLVE, "tests/test.sh": QC_TEST_SH,
                      "tests/test_outputs.py": test_py, "task.toml": f'version = "1.0"\n[metadata]\n{meta}'
                      '[verifier]\ntimeout_sec = 60.0\n',
                      **{f"tests/{k}": v for k, v in extra.items()}}.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(text)
    row = tasktool.validate_task(docker_env, d, k=1)
    assert row["status"] == verdict, row
    if verdict == "truth_in_reach":
        assert re.search(r"/opt/answer_truth\.txt|/app/verify\.py|/app/data/records\.csv", row["error"]), row


# --- real folders refused for their real reason --------------------------------------------------------

def test_every_refusal_names_the_task_folder(tmp_path):
    """Bug: a Dockerfile that copies the tests was refused as `Dockerfile:35: COPY run-tests.sh …`,
    which names no task among a hundred. Every refusal names the folder."""
    d = _copy("tb1-hello", tmp_path / "copies-tests")
    (d / "Dockerfile").write_text((d / "Dockerfile").read_text() + "COPY run-tests.sh /run-tests.sh\n")
    with pytest.raises(T.TaskError, match=rf"^{re.escape(str(d / 'Dockerfile'))}:4: COPY run-tests.sh"):
        T.load_task(d)
    d = _copy("tb2-partial", tmp_path / "bad-timeout")
    toml = (d / "task.toml").read_text()
    (d / "task.toml").write_text(toml.replace("timeout_sec = 60.0", 'timeout_sec = "x"'))
    with pytest.raises(T.TaskError, match=rf"^{re.escape(str(d))}"):
        T.load_task(d)


@pytest.mark.parametrize("layout,remove,add,refused", [
    ("tb2-partial", "instruction.md", ("task.toml+", '[[steps]]\ninstruction = "step 1"\n'), "multi-step"),
    ("tb2-partial", "environment/Dockerfile", ("environment/docker-compose.yaml", COMPOSE_TWO),
     "multi-container"),
    ("tb1-hello", "Dockerfile", ("docker-compose.yaml", COMPOSE_TWO), "multi-container"),
])
def test_multi_step_and_multi_container_are_said_before_missing_files(tmp_path, layout, remove, add, refused):
    """Bug: a Harbor multi-step task (its instructions in [[steps]], no instruction.md) was refused as
    "instruction.md: missing", a compose task (no Dockerfile of its own) as "Dockerfile: missing"."""
    d = _copy(layout, tmp_path / layout)
    (d / remove).unlink()
    where, text = add
    if where.endswith("+"):
        (d / where[:-1]).write_text((d / where[:-1]).read_text() + text)
    else:
        (d / where).write_text(text)
    with pytest.raises(T.TaskError, match=refused):
        T.load_task(d)


# TB1's mnist-learning-fix and pandas-sql-query use files of their tests to build the image, in a stage
# the final image does not inherit or removed later in the same stage: the agent never sees them.
BUILDER_STAGE = ("FROM termrl-base:bookworm AS builder\nCOPY tests/gen.py /build/gen.py\n"
                 "RUN python3 /build/gen.py > /build/data.txt\n"
                 "FROM termrl-base:bookworm\nWORKDIR /app\n"
                 "COPY --from=builder /build/data.txt /app/data.txt\n")
REMOVED = ("FROM termrl-base:bookworm\nWORKDIR /app\nCOPY tests/gen.py /tmp/gen.py\n"
           "RUN python3 /tmp/gen.py > /app/data.txt\nRUN rm -f /tmp/gen.py\n")


@pytest.mark.parametrize("dockerfile,why", [(BUILDER_STAGE, "only in stage 1"), (REMOVED, "line 5 removes")])
def test_a_copy_of_tests_the_final_image_never_holds_is_refused_with_advice_that_works(docker_env, tmp_path,
                                                                                     dockerfile, why):
    """Bug: such a task was refused with "the agent would read them … delete this line", and deleting
    the line breaks it. The refusal says why the line cannot build (the tests are never in the build
    context), that the agent would not see them, and what to do; done, the task loads and builds with
    the data, and its image holds no test file."""
    d = _copy("tb1-hello", tmp_path / "uses-tests")
    (d / "tests" / "gen.py").write_text("print('made-from-tests')\n")
    (d / "Dockerfile").write_text(dockerfile)
    with pytest.raises(T.TaskError) as e:
        T.load_task(d)
    msg = str(e.value)
    assert msg.startswith(f"{d / 'Dockerfile'}:") and why in msg and "never reach the final image" in msg, msg
    assert "delete this line" not in msg and "build-input/gen.py" in msg, msg
    (d / "build-input").mkdir()
    shutil.copy(d / "tests" / "gen.py", d / "build-input" / "gen.py")
    (d / "Dockerfile").write_text(dockerfile.replace("COPY tests/gen.py", "COPY build-input/gen.py"))
    with docker_env.reset(T.load_task(d)) as term:
        assert term.run("cat /app/data.txt").output == "made-from-tests\n"
        assert term.run("ls /build/gen.py /tmp/gen.py 2>&1 | grep -c 'No such'").output.strip() in ("1", "2")


def test_a_registry_that_cannot_be_reached_is_the_machines_not_the_tasks(docker_env, tmp_path):
    """Bug: a build whose base image's registry could not be reached was `build_fails`, a defect of the
    task; it is the machine's (infra_error), as a task's own failing Dockerfile stays build_fails."""
    d = _copy("tb1-hello", tmp_path / "far-base")
    far = f"registry-{uuid.uuid4().hex[:8]}.invalid:5000/base/img:1"
    (d / "Dockerfile").write_text(f"FROM {far}\nWORKDIR /app\n")
    row = tasktool.validate_task(docker_env, d, k=1)
    assert row["status"] == "infra_error" and "registry" in row["error"], row
