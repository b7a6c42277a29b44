"""Build hooks that pyproject.toml cannot express.

The wheel must carry `probing-autostart.pth` at the top of site-packages: that file is how
`PROBING=1 python train.py` starts the agent at interpreter start-up. setuptools only puts
package files under `probing/`, so build_py copies the .pth to the root of build_lib, which
is the root of the wheel.
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH_SOURCE = os.path.join("probing", "agent", "probing-autostart.pth")


class BuildPyWithAutostart(build_py):
    def run(self) -> None:
        super().run()
        self.copy_file(PTH_SOURCE, os.path.join(self.build_lib, "probing-autostart.pth"))

    def get_outputs(self, include_bytecode: bool = True) -> list:  # type: ignore[override]
        return [
            *super().get_outputs(include_bytecode),
            os.path.join(self.build_lib, "probing-autostart.pth"),
        ]


setup(cmdclass={"build_py": BuildPyWithAutostart})
