"""Build steps that pyproject.toml cannot express.

1. The wheel carries `probing-autostart.pth` at the top of site-packages: that file is how
   `PROBING=1 python train.py` starts the agent at interpreter start-up. setuptools only
   puts package files under `probing/`, so build_py copies the .pth to the root of
   build_lib, which is the root of the wheel.
2. native/ is compiled with the system C compiler into probing/_native/: the helper library
   a running process is made to load, and the ptrace injector that makes it. A missing
   compiler stops the install with a message saying so.
3. native/front/ is compiled into the `probing` command itself (the native front end,
   docs/decisions.md): build_scripts puts it beside the Python CLI's script, `probing-python`,
   which it hands every command line it does not answer itself. The rules it shares with the
   Python CLI (thread states, escapes, the protocol's constants) are generated from the Python
   modules first (native/front/gen_tables.py), into the build folder.
4. The wheel is tagged py3-none-<platform>: its native parts are a standalone program and a
   library that finds the interpreter's symbols with dlsym at run time, not extension modules
   built against one Python's headers. One wheel per platform serves every supported CPython,
   and installing it compiles nothing.
5. Built against glibc on x86-64, the native parts run on any glibc since 2.28 (`make wheel`
   tags the wheel manylinux_2_28 with auditwheel): the two programs are linked statically, and
   the helper library, which must load into the job's own glibc, binds the few symbols glibc has
   versioned since 2.28 to their old versions (native/glibc_compat.h). Where static linking is
   not possible (no libc.a: Fedora without glibc-static), the programs are linked dynamically,
   for this machine's glibc, and the build says so.
"""

import os
import platform
import shutil
import subprocess
import sys
import sysconfig

# After setuptools: its own copy of distutils (Python 3.12 has none) answers this import.
from distutils.command.build_scripts import build_scripts  # noqa: E402, I001

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

try:  # setuptools >= 70.1 carries bdist_wheel; before that it came with the wheel package
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # pragma: no cover
    from wheel.bdist_wheel import bdist_wheel  # type: ignore[no-redef]

PTH_SOURCE = os.path.join("probing", "agent", "probing-autostart.pth")
NATIVE = [
    # (output, sources, flags)
    ("libprobing-helper.so", ["native/helper.c"], ["-shared", "-fPIC", "-pthread", "-ldl"]),
    (
        "probing-inject",
        ["native/inject.c", "native/report.c", "native/maps.c", "native/threads.c", "native/borrow.c"],
        [],
    ),
]


# x86-64 glibc: the helper's symbols bound to glibc 2.28's versions, the programs static.
PORTABLE = platform.libc_ver()[0] == "glibc" and platform.machine() == "x86_64"
LIBRARY_FLAGS = ["-include", os.path.join("native", "glibc_compat.h")] if PORTABLE else []


def compile_native(command: list, program: bool, what: str, announce: object) -> None:
    """Run the compiler; a program statically linked where the platform allows, else as the
    machine links it (said on stderr)."""
    attempts = [[*command, "-static"], command] if program and PORTABLE else [command]
    for attempt in attempts:
        announce(" ".join(attempt), level=2)  # type: ignore[operator]
        result = subprocess.run(attempt, capture_output=True, text=True)
        if result.returncode == 0:
            if attempt is not attempts[0]:
                said = f"probing: {what} linked for this machine's glibc only (no static libc)"
                print(said, file=sys.stderr)
            return
    raise SystemExit(f"probing: compiling {what} failed:\n{result.stderr}")


def compiler() -> str:
    for candidate in (os.environ.get("CC"), sysconfig.get_config_var("CC"), "cc", "gcc", "clang"):
        if candidate and shutil.which(candidate.split()[0]):
            return candidate.split()[0]
    raise SystemExit(
        "probing: no C compiler found (tried $CC, cc, gcc, clang). probing builds its attach "
        "helper from native/*.c at install time: install one (Debian/Ubuntu: apt-get install gcc; "
        "Fedora: dnf install gcc) and install probing again."
    )


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        self.copy_file(PTH_SOURCE, os.path.join(self.build_lib, "probing-autostart.pth"))
        target = os.path.join(self.build_lib, "probing", "_native")
        os.makedirs(target, exist_ok=True)
        cc = compiler()
        for output, sources, flags in NATIVE:
            library = output.endswith(".so")
            extra = LIBRARY_FLAGS if library else []
            command = [cc, "-O2", "-Wall", *extra, "-o", os.path.join(target, output), *sources, *flags]
            compile_native(command, not library, " ".join(sources), self.announce)

    def get_outputs(self, include_bytecode: bool = True) -> list:  # type: ignore[override]
        native = [os.path.join(self.build_lib, "probing", "_native", output) for output, _, _ in NATIVE]
        pth = os.path.join(self.build_lib, "probing-autostart.pth")
        return [*super().get_outputs(include_bytecode), pth, *native]


FRONT_SOURCES = sorted(
    os.path.join("native", "front", name)
    for name in os.listdir(os.path.join("native", "front"))
    if name.endswith(".c")
    and name != "check.c"  # check.c: a test driver (tests/integration/test_front_rules.py)
)


class BuildScripts(build_scripts):
    """The Python CLI's script as setuptools copies it (its `#!python` line becomes the
    interpreter's path at install), and the native front end beside it as `probing`."""

    def run(self) -> None:
        super().run()
        generated = os.path.join(self.build_dir, "..", "front-tables")
        os.makedirs(generated, exist_ok=True)
        header = os.path.join(generated, "front_tables.h")
        tables = [sys.executable, os.path.join("native", "front", "gen_tables.py"), os.getcwd(), header]
        result = subprocess.run(tables, capture_output=True, text=True)
        if result.returncode != 0:
            raise SystemExit(f"probing: generating {header} failed:\n{result.stderr}")
        output = os.path.join(self.build_dir, "probing")
        command = [compiler(), "-O2", "-Wall", "-Wextra", "-I", generated, "-o", output, *FRONT_SOURCES]
        compile_native(command, True, "native/front", self.announce)

    def get_outputs(self) -> list:  # type: ignore[override]
        return [*super().get_outputs(), os.path.join(self.build_dir, "probing")]


class BinaryDistribution(Distribution):
    """The wheel holds compiled code: it installs into platlib and names its platform."""

    def has_ext_modules(self) -> bool:
        return True


class PlatformWheel(bdist_wheel):  # type: ignore[misc]
    """py3-none-<platform>, not cp311-cp311-<platform>: no part of the wheel is tied to one
    CPython's ABI (the docstring at the top says why), so every supported version takes it."""

    def get_tag(self) -> tuple:  # type: ignore[type-arg]
        _, _, platform = super().get_tag()
        return "py3", "none", platform


setup(
    cmdclass={"build_py": BuildPy, "build_scripts": BuildScripts, "bdist_wheel": PlatformWheel},
    distclass=BinaryDistribution,
)
