"""A stand-in ``docker`` executable for the promotion tests (no Docker engine runs in CI).

It keeps an image store (ref -> sha256 id) in a JSON file, records every call with its KDTREE_*
environment, and answers what the promotion CLI uses: ``build``, ``image inspect``, ``tag``,
``push`` and ``compose up|run|down``. ``compose run parity`` does what the parity container would
do: it takes the parity service's command and environment from the real compose.yaml
(interpolated as Compose does), points the service URLs at real reference-engine servers on
loopback, maps ``/reports`` onto the bind-mounted directory, and runs the real ``kdtree-parity``
CLI, returning its exit code.

Environment: FAKE_DOCKER_STATE (directory for its files), FAKE_DOCKER_URLS (JSON: compose
service -> base URL), FAKE_DOCKER_FAIL (JSON: command word such as "up", "run" or "push" -> the
exit code it fails with), FAKE_DOCKER_BUILD_SEED (changes the ids that builds produce).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from compose_model import command_args, load_compose

STATE = Path(os.environ["FAKE_DOCKER_STATE"])


def _load(name: str) -> dict[str, Any]:
    path = STATE / name
    return json.loads(path.read_text()) if path.exists() else {}


def _save(name: str, data: dict[str, Any]) -> None:
    (STATE / name).write_text(json.dumps(data, indent=2, sort_keys=True))


def _resolve(ref: str) -> str | None:
    images = _load("images.json")
    if ref in images:
        return images[ref]
    return ref if ref.startswith("sha256:") and ref in images.values() else None


def _option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def _fail_if_configured(*words: str) -> None:
    """FAKE_DOCKER_FAIL keys: a command word ("up", "push") or a whole call ("push x:stable")."""
    failures = json.loads(os.environ.get("FAKE_DOCKER_FAIL", "{}"))
    for word in words:
        if word in failures:
            print(f"fake docker: '{word}' fails as the test asked", file=sys.stderr)
            sys.exit(int(failures[word]))


def _no_such_image(ref: str) -> int:
    print(f"Error response from daemon: No such image: {ref}", file=sys.stderr)
    return 1


def build(args: list[str]) -> int:
    ref, target = _option(args, "--tag"), _option(args, "--target")
    seed = os.environ.get("FAKE_DOCKER_BUILD_SEED", "0")
    images = _load("images.json")
    images[ref] = "sha256:" + hashlib.sha256(f"{target}|{ref}|{seed}".encode()).hexdigest()
    _save("images.json", images)
    return 0


def image_rm(args: list[str]) -> int:
    images = _load("images.json")
    if args[0] not in images:
        return _no_such_image(args[0])
    del images[args[0]]
    _save("images.json", images)
    return 0


def image_inspect(args: list[str]) -> int:
    fmt, ref = _option(args, "--format"), args[-1]
    digest = _resolve(ref)
    if digest is None:
        return _no_such_image(ref)
    if fmt == "{{.Id}}":
        print(digest)
    elif fmt == "{{json .RepoDigests}}":
        repository = ref.rsplit(":", 1)[0]
        pushed = _load("pushed.json")
        print(json.dumps([f"{repository}@{digest}"] if pushed.get(ref) == digest else []))
    else:
        print(f"fake docker: unsupported --format {fmt}", file=sys.stderr)
        return 2
    return 0


def tag(args: list[str]) -> int:
    source, target = args
    digest = _resolve(source)
    if digest is None:
        return _no_such_image(source)
    images = _load("images.json")
    images[target] = digest
    _save("images.json", images)
    return 0


def push(args: list[str]) -> int:
    digest = _resolve(args[0])
    if digest is None:
        return _no_such_image(args[0])
    pushed = _load("pushed.json")
    pushed[args[0]] = digest
    _save("pushed.json", pushed)
    return 0


def compose(args: list[str]) -> int:
    project = load_compose(os.environ, Path(_option(args, "--file")))
    rest = args[args.index("--file") + 2 :]
    while rest[:1] == ["--profile"]:  # global options before the verb
        rest = rest[2:]
    verb = rest[0]
    _fail_if_configured(verb)
    if verb == "up":
        services = [s for s in rest[1:] if s in project["services"]]
        for service in services:
            image = project["services"][service]["image"]
            if _resolve(image) is None:  # Compose would try to pull it and fail
                print(f"pull access denied for {image}", file=sys.stderr)
                return 1
        _save("up.json", {"services": services})
        return 0
    if verb == "down":
        _save("up.json", {"services": []})
        return 0
    if verb == "run" and rest[-1] == "parity":
        service = project["services"]["parity"]
        if _resolve(service["image"]) is None:
            return _no_such_image(service["image"])
        if not set(service["depends_on"]) <= set(_load("up.json").get("services", [])):
            print("fake docker: parity's dependencies are not up", file=sys.stderr)
            return 1
        return run_parity(service)
    print(f"fake docker: unsupported compose call {rest}", file=sys.stderr)
    return 2


def run_parity(service: dict[str, Any]) -> int:
    """What the parity container runs, against the real servers on loopback."""
    urls = json.loads(os.environ["FAKE_DOCKER_URLS"])
    reports = os.environ["KDTREE_REPORTS_DIR"]

    def to_host(value: str) -> str:
        for name, url in urls.items():
            value = value.replace(f"http://{name}:30000", url)
        return reports + value[len("/reports") :] if value.startswith("/reports/") else value

    argv = [to_host(arg) for arg in command_args(service)]
    env = {**os.environ, **{k: to_host(str(v)) for k, v in service.get("environment", {}).items()}}
    parity = Path(sys.executable).parent / "kdtree-parity"
    return subprocess.run([str(parity), *argv, "--no-progress"], env=env, check=False).returncode


def main(argv: list[str]) -> int:
    STATE.mkdir(parents=True, exist_ok=True)
    kdtree_env = {k: v for k, v in os.environ.items() if k.startswith("KDTREE_")}
    with (STATE / "calls.jsonl").open("a") as calls:
        calls.write(json.dumps({"argv": argv, "env": kdtree_env}) + "\n")
    if argv and argv[0] in {"build", "tag", "push"}:
        _fail_if_configured(argv[0], " ".join(argv))
    handlers = {"build": build, "tag": tag, "push": push, "compose": compose}
    if argv[:2] == ["image", "inspect"]:
        return image_inspect(argv[2:])
    if argv[:2] == ["image", "rm"]:
        return image_rm(argv[2:])
    if argv and argv[0] in handlers:
        return handlers[argv[0]](argv[1:])
    print(f"fake docker: unsupported call {argv}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
