"""`bundle`: what must travel to the lent GPU machine, assembled here, with its size checked.

The device has no package registry and no internet. Its image (workplace image 'cuda', read on
2026-11-17, see DEVICE_IMAGE) holds torch, transformers, sentencepiece and most of the
scientific stack; tibnlp's other dependencies travel as wheels for CPython 3.12 on manylinux
x86-64, at the versions installed here (the ones the test suite ran with). The closure is
walked from pyproject's `dependencies` through each wheel's `Requires-Dist` (markers evaluated
for the device), stopping at packages the image has. DeepSpeed is published as a source
archive only: it is built here into a pure-Python wheel (no ops prebuilt; the device JIT-builds
any it needs with its nvcc and ninja). The data subset is the raw corpora and the TNCC and
WCM-bo splits, in one tar.

Everything that travels (the repository tree git would send plus the bundle) must stay under
the device tool's 64 MiB; `bundle` measures it, writes the figure to
benchmarks/results/gpu.md, and exits non-zero naming the largest parts when it is over.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import tomllib
from packaging.markers import Marker
from packaging.requirements import Requirement

from benchmarks.gpu import results

LIMIT = 64 * 2**20  # the device tool's limit on the working tree that travels, carry included
BUNDLE = Path(".bundle")
DATA_TAR = "data.tar.xz"  # in the repository root, git-ignored, named in the tool's `carry`
PLATFORMS = [
    "manylinux2014_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_34_x86_64",
    "manylinux1_x86_64",
]
# PEP 508 marker environment of the device's python3 (CPython 3.12.3, Linux x86-64)
DEVICE_ENV = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_name": "cpython",
    "implementation_version": "3.12.3",
    "platform_python_implementation": "CPython",
    "os_name": "posix",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "platform_release": "",
    "platform_version": "",
    "extra": "",
}
# The packages of the device image 'cuda' (normalised names), as the device tool's KINDS.md
# listed them on 2026-11-17. `run check` reports any import that still fails there.
DEVICE_IMAGE = frozenset(
    [
        "absl-py",
        "accelerate",
        "aiofiles",
        "aiohappyeyeballs",
        "aiohttp",
        "aiosignal",
        "annotated-doc",
        "anyio",
        "attrs",
        "botorch",
        "build",
        "certifi",
        "charset-normalizer",
        "chex",
        "click",
        "cloudpickle",
        "cmake",
        "colorama",
        "contourpy",
        "coverage",
        "cuda-bindings",
        "cuda-core",
        "cuda-pathfinder",
        "cuda-toolkit",
        "cupy-cuda13x",
        "cycler",
        "cython",
        "diffrax",
        "e3nn",
        "einops",
        "equinox",
        "etils",
        "execnet",
        "filelock",
        "flatbuffers",
        "flax",
        "fonttools",
        "formulaic",
        "frozenlist",
        "fsspec",
        "gpytorch",
        "grpcio",
        "h11",
        "h5py",
        "hf-xet",
        "httpcore",
        "httpx",
        "huggingface-hub",
        "humanize",
        "hypothesis",
        "idna",
        "imageio",
        "iniconfig",
        "interface-meta",
        "jax",
        "jax-cuda13-pjrt",
        "jax-cuda13-plugin",
        "jaxlib",
        "jaxtyping",
        "jinja2",
        "joblib",
        "kiwisolver",
        "lazy-loader",
        "lightning",
        "lightning-utilities",
        "linear-operator",
        "lineax",
        "llvmlite",
        "lxml",
        "markdown",
        "markdown-it-py",
        "markupsafe",
        "matplotlib",
        "mdurl",
        "meson",
        "ml-dtypes",
        "mpi4py",
        "mpmath",
        "msgpack",
        "multidict",
        "multipledispatch",
        "mypy-extensions",
        "nanobind",
        "narwhals",
        "networkx",
        "ninja",
        "numba",
        "numba-cuda",
        "numpy",
        "numpyro",
        "nvidia-cublas",
        "nvidia-cuda-cupti",
        "nvidia-cuda-nvrtc",
        "nvidia-cuda-runtime",
        "nvidia-cudnn-cu13",
        "nvidia-cufft",
        "nvidia-cufile",
        "nvidia-curand",
        "nvidia-cusolver",
        "nvidia-cusparse",
        "nvidia-cusparselt-cu13",
        "nvidia-ml-py",
        "nvidia-nccl-cu13",
        "nvidia-nvjitlink",
        "nvidia-nvshmem-cu13",
        "nvidia-nvtx",
        "onnx",
        "onnx-ir",
        "onnxruntime",
        "onnxscript",
        "opencv-python-headless",
        "optax",
        "opt-einsum",
        "opt-einsum-fx",
        "optimistix",
        "orbax-checkpoint",
        "packaging",
        "pandas",
        "pathspec",
        "patsy",
        "peft",
        "pillow",
        "pip",
        "pluggy",
        "portalocker",
        "prometheus-client",
        "propcache",
        "protobuf",
        "psutil",
        "pyarrow",
        "pybind11",
        "py-cpuinfo",
        "pygments",
        "pyparsing",
        "pyproject-hooks",
        "pyre-extensions",
        "pytest",
        "pytest-benchmark",
        "pytest-cov",
        "pytest-mock",
        "pytest-timeout",
        "pytest-xdist",
        "python-dateutil",
        "pytorch-lightning",
        "pyyaml",
        "regex",
        "requests",
        "rich",
        "sacrebleu",
        "safetensors",
        "scikit-build-core",
        "scikit-image",
        "scikit-learn",
        "scipy",
        "seaborn",
        "sentencepiece",
        "sentence-transformers",
        "setuptools",
        "shellingham",
        "simplejson",
        "six",
        "sortedcontainers",
        "statsmodels",
        "sympy",
        "tabulate",
        "tensorboard",
        "tensorboard-data-server",
        "tensorstore",
        "threadpoolctl",
        "tifffile",
        "tiktoken",
        "timm",
        "tokenizers",
        "toolz",
        "torch",
        "torchaudio",
        "torchdiffeq",
        "torch-geometric",
        "torchmetrics",
        "torchvision",
        "tqdm",
        "transformers",
        "treescope",
        "triton",
        "typer",
        "typing-extensions",
        "typing-inspect",
        "urllib3",
        "uvloop",
        "wadler-lindig",
        "werkzeug",
        "wheel",
        "wrapt",
        "xarray",
        "xxhash",
        "yarl",
        "zipp",
    ]
)
# The device serves no MLflow UI: the `mlflow` wheel (UI assets, server and its dependencies,
# ~20 MiB) stays behind; the client and the SQLite store it uses (SQLAlchemy + Alembic) travel.
SUBSTITUTES = {"mlflow": ["mlflow-skinny", "sqlalchemy", "alembic"]}
# The data subset under TIBNLP_DATA: raw corpora for `pretrain`, the labelled splits for
# `finetune` (the full TNCC/WCM-bo files and their originals stay behind: the splits suffice)
DATA = {
    "corpora": ["*.txt.xz", "SOURCES.md"],
    "tncc": ["labels.json", "SOURCE.md", "tncc_title_*.jsonl"],
    "wcm_bo": ["labels.json", "SOURCE.md", "wcm_bo_*.jsonl"],
}


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class Bundle:
    wheels: dict[str, Path] = field(default_factory=dict)  # normalised name -> wheel
    skipped: dict[str, str] = field(default_factory=dict)  # name -> why it does not travel


def _requirements(wheel: Path) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    reqs = []
    for line in text.splitlines():
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1].strip())
            if req.marker is None or Marker(str(req.marker)).evaluate(DEVICE_ENV):
                reqs.append(req)
    return reqs


def _pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", *args]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"bundle: `{' '.join(cmd)}` failed:\n{done.stderr[-2000:]}")


def _download(name: str, version: str, wheels: Path) -> Path:
    """The wheel of name==version for the device (cached in `wheels`)."""
    norm = normalise(name).replace("-", "_")
    for w in wheels.glob("*.whl"):
        if normalise(w.name.split("-")[0]).replace("-", "_") == norm and (
            w.name.split("-")[1] == version
        ):
            return w
    if normalise(name) == "deepspeed":
        return _build_deepspeed(version, wheels)
    platforms = [a for p in PLATFORMS for a in ("--platform", p)]
    _pip(
        "download",
        "--quiet",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        "3.12",
        "--implementation",
        "cp",
        *platforms,
        "-d",
        str(wheels),
        f"{name}=={version}",
    )
    return _download(name, version, wheels)


def _build_deepspeed(version: str, wheels: Path) -> Path:
    """DeepSpeed's sdist built into a wheel here, ops left to the device's JIT (DS_BUILD_OPS=0);
    the build imports torch, so it runs without build isolation in this environment."""
    with tempfile.TemporaryDirectory() as tmp:
        _pip(
            "download",
            "--quiet",
            "--no-deps",
            "--no-binary=:all:",
            "-d",
            tmp,
            f"deepspeed=={version}",
        )
        sdist = next(Path(tmp).glob("deepspeed-*"))
        env = {**os.environ, "DS_BUILD_OPS": "0"}
        cmd = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps"]
        cmd += ["--no-build-isolation", "-w", str(wheels), str(sdist)]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if done.returncode:
            raise SystemExit(f"bundle: building DeepSpeed {version} failed:\n{done.stderr[-2000:]}")
    built = [w for w in wheels.glob(f"deepspeed-{version}-*.whl")]
    if not built or not built[0].name.endswith("-py3-none-any.whl"):
        raise SystemExit(f"bundle: expected a pure-Python DeepSpeed wheel, got {built}")
    return built[0]


def roots(pyproject: Path = Path("pyproject.toml")) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    return [Requirement(r).name for r in project["dependencies"]]


def resolve(names: list[str], wheels: Path) -> Bundle:
    """The closure of `names` minus the device image, one wheel each at the local version."""
    out = Bundle()
    todo = list(names)
    while todo:
        name = todo.pop()
        norm = normalise(name)
        if norm in out.wheels or norm in out.skipped:
            continue
        if norm in DEVICE_IMAGE:
            out.skipped[norm] = "in the device image"
            continue
        if norm in SUBSTITUTES:
            out.skipped[norm] = "replaced by " + ", ".join(SUBSTITUTES[norm])
            todo += SUBSTITUTES[norm]
            continue
        try:
            version = md.version(name)
        except md.PackageNotFoundError:
            raise SystemExit(
                f"bundle: {name} is needed on the device but not installed here; install it "
                "(pip install -e '.[dev]') so the bundle carries the version the tests use"
            ) from None
        wheel = _download(name, version, wheels)
        out.wheels[norm] = wheel
        todo += [r.name for r in _requirements(wheel)]
    return out


def pack_data(data_dir: Path, out: Path) -> list[str]:
    """The data subset as one xz tar (the JSONL splits shrink ~5x; the corpora are xz already)."""
    members = []
    for sub, patterns in DATA.items():
        for pattern in patterns:
            found = sorted((data_dir / sub).glob(pattern))
            if not found:
                raise SystemExit(
                    f"bundle: no {sub}/{pattern} under TIBNLP_DATA={data_dir}; "
                    "point TIBNLP_DATA at the shared datasets"
                )
            members += [f"{sub}/{p.name}" for p in found]
    tmp = out.with_name(f".{out.name}.tmp")
    with tarfile.open(tmp, "w:xz") as tar:
        for m in members:
            tar.add(data_dir / m, arcname=m)  # follows the data dir's symbolic links
    os.replace(tmp, out)
    return members


def tree_bytes(root: Path = Path(".")) -> int:
    """What git sends: tracked plus untracked-not-ignored files."""
    listing = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout
    paths = {p for p in listing.decode().split("\0") if p}
    return sum((root / p).stat().st_size for p in paths if (root / p).is_file())


def dir_bytes(path: Path) -> dict[str, int]:
    return {
        str(p.relative_to(path.parent)): p.stat().st_size
        for p in sorted(path.rglob("*"))
        if p.is_file() and not p.name.startswith(".")
    }


def build(data_dir: Path, out: Path = BUNDLE) -> dict[str, object]:
    wheels = out / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    resolved = resolve(roots(), wheels)
    keep = {w.name for w in resolved.wheels.values()}
    for stale in wheels.glob("*.whl"):  # an older version left from a previous bundle
        if stale.name not in keep:
            stale.unlink()
    members = pack_data(data_dir, out / DATA_TAR)
    manifest = {
        "wheels": sorted(keep),
        "from_device_image": sorted(resolved.skipped),
        "data": members,
        "python": "cp312 manylinux x86_64",
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def size_report(out: Path = BUNDLE) -> tuple[int, str]:
    tree = tree_bytes()
    files = dir_bytes(out)
    wheels = sum(v for k, v in files.items() if "/wheels/" in k)
    data = files.get(f"{out.name}/{DATA_TAR}", 0)
    other = sum(files.values()) - wheels - data
    total = tree + sum(files.values())
    largest = sorted(files.items(), key=lambda kv: -kv[1])[:6]
    mib = 2**20
    lines = [
        "| part | MiB |",
        "|---|---:|",
        f"| repository tree (tracked + untracked, not ignored) | {tree / mib:.1f} |",
        f"| wheels ({sum(1 for k in files if k.endswith('.whl'))}) | {wheels / mib:.1f} |",
        f"| data subset ({DATA_TAR}) | {data / mib:.1f} |",
        f"| other bundle files (the curve's start, model parts, manifest) | {other / mib:.1f} |",
        f"| **total that travels** | **{total / mib:.1f}** of {LIMIT / mib:.0f} |",
        "",
        "Largest files: " + ", ".join(f"{k} {v / mib:.1f} MiB" for k, v in largest) + ".",
    ]
    return total, "\n".join(lines)


def main(data_dir: Path) -> int:
    manifest = build(data_dir)
    total, table = size_report()
    wheels = ", ".join(w.split("-")[0] + " " + w.split("-")[1] for w in manifest["wheels"])  # type: ignore[attr-defined]
    text = (
        "`PYTHONPATH=. python -m benchmarks.gpu bundle` (here, with network):\n\n"
        f"{table}\n\nWheels: {wheels}.\n"
    )
    print(text)
    if total > LIMIT:
        print(
            f"bundle: {total / 2**20:.1f} MiB would travel, over the device tool's "
            f"{LIMIT / 2**20:.0f} MiB; drop data or wheels (largest listed above)",
            file=sys.stderr,
        )
        results.update_section(
            "bundle", text + "\n**Over the limit: this bundle cannot travel.**\n"
        )
        return 1
    results.update_section("bundle", text)
    return 0
